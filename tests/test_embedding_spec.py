"""What a model declares about its embeddings (localinfer/loading/embedding_spec.py) and
Session.embed: pooling read from a GGUF header or a sentence-transformers directory, the default
for models that declare none, shortened vectors, and the session helper on the embedded model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localinfer.errors import InvalidParameterError, UnsupportedModelError
from localinfer.loading.embedding_spec import embedding_spec, shortened
from localinfer.loading.loader import load_model
from localinfer.loading.model import LoadedModel
from localinfer.session import Session, open_session
from tests.gguf_writer import raw_u32, rewrite_gguf, write_tiny_gguf
from tests.tiny import tiny_config, tiny_model, tiny_weights


def gguf_model(tmp_path: Path, pooling_type: int | None) -> LoadedModel:
    config = tiny_config("llama", vocab_size=260)
    plain = write_tiny_gguf(
        tmp_path / "plain.gguf", config, tiny_weights(config), tokenizer="bytes"
    )
    if pooling_type is None:
        return load_model(plain)
    path = rewrite_gguf(
        plain, tmp_path / "pooled.gguf", set_kv={"llama.pooling_type": raw_u32(pooling_type)}
    )
    return load_model(path)


@pytest.mark.parametrize(("value", "pooling"), [(1, "mean"), (2, "cls"), (3, "last")])
def test_gguf_pooling_type_is_read(tmp_path: Path, value: int, pooling: str) -> None:
    spec = embedding_spec(gguf_model(tmp_path, value))
    assert (spec.pooling, spec.pooling_source, spec.dimensions) == (
        pooling,
        "llama.pooling_type",
        64,
    )


def test_gguf_without_pooling_or_none_is_mean_by_default(tmp_path: Path) -> None:
    for value in (None, 0):
        spec = embedding_spec(gguf_model(tmp_path, value))
        assert spec.pooling == "mean" and "default" in spec.pooling_source


def test_gguf_rank_pooling_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="rank pooling"):
        embedding_spec(gguf_model(tmp_path, 4))


def hf_dir(tmp_path: Path, pooling: dict[str, bool] | None, config: dict | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config or {}))
    if pooling is not None:
        kinds = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
        modules = [
            {"idx": i, "path": path, "type": f"sentence_transformers.models.{kind}"}
            for i, (path, kind) in enumerate(kinds)
        ]
        (tmp_path / "modules.json").write_text(json.dumps(modules))
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


def dir_model(path: Path) -> LoadedModel:
    return tiny_model("qwen3", path=path)


@pytest.mark.parametrize(
    ("key", "pooling"),
    [
        ("pooling_mode_lasttoken", "last"),
        ("pooling_mode_cls_token", "cls"),
        ("pooling_mode_mean_tokens", "mean"),
    ],
)
def test_sentence_transformers_pooling_is_read(tmp_path: Path, key: str, pooling: str) -> None:
    modes = {"pooling_mode_lasttoken": False, "pooling_mode_mean_tokens": False, key: True}
    spec = embedding_spec(dir_model(hf_dir(tmp_path, modes)))
    assert spec.pooling == pooling and spec.pooling_source == f"1_Pooling/config.json: {key}"


def test_sentence_transformers_max_pooling_is_refused(tmp_path: Path) -> None:
    path = hf_dir(tmp_path, {"pooling_mode_max_tokens": True})
    with pytest.raises(UnsupportedModelError, match="pooling_mode_max_tokens"):
        embedding_spec(dir_model(path))


def test_any_length_up_to_the_width(tmp_path: Path) -> None:
    """As OpenAI's text-embedding-3 models: any length from 1 to the width, whatever the model
    declares; above the width is what the model cannot give, below 1 a bad value."""
    for name, config in (("listed", {"matryoshka_dimensions": [32, 16]}), ("plain", {})):
        spec = embedding_spec(dir_model(hf_dir(tmp_path / name, None, config)))
        assert spec.dimensions == 64 and spec.pooling == "mean"
        assert [spec.check_dimensions(n) for n in (1, 20, 63)] == [1, 20, 63]
        assert spec.check_dimensions(64) is None and spec.check_dimensions(None) is None
        with pytest.raises(UnsupportedModelError, match=r"^--dim: 65 is more than the 64 dim"):
            spec.check_dimensions(65, field="--dim")
        with pytest.raises(InvalidParameterError, match=r"^dimensions: must be at least 1"):
            spec.check_dimensions(0)


def test_shortened_vectors_are_renormalised_prefixes() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(3, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cut = shortened(vectors, 16)
    assert cut.shape == (3, 16) and cut.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        cut * np.linalg.norm(vectors[:, :16], axis=1)[:, None], vectors[:, :16], rtol=1e-5
    )
    assert shortened(vectors, None) is vectors


# -- Session.embed on the embedded model ---------------------------------------------------------


@pytest.fixture(scope="module")
def session():
    s = open_session(None, backend="torch", slots=1, ctx=256, threads=1)
    yield s
    s.close()


def test_session_embeds_texts_and_ids_through_the_engine(session: Session) -> None:
    spec = session.embedding_spec
    assert (spec.pooling, spec.dimensions) == ("mean", 576)
    texts = ["The cat sat on the mat.", "A dog lay on the rug.", "Stock markets fell today."]
    ids = [session.raw_prompt_ids(t) for t in texts]
    result = session.embed([texts[0], ids[1], texts[2]])
    assert result.vectors.shape == (3, 576) and result.prompt_tokens == sum(map(len, ids))
    np.testing.assert_allclose(np.linalg.norm(result.vectors, axis=1), 1.0, rtol=1e-5)
    direct = session.engine.runner.embed(ids, "mean")
    np.testing.assert_allclose(result.vectors, direct, atol=1e-5)
    cosine = result.vectors @ result.vectors.T
    assert cosine[0, 1] > cosine[0, 2]  # the two animal sentences are nearer each other


def test_session_dimensions(session: Session) -> None:
    with pytest.raises(UnsupportedModelError, match=r"^dimensions: 577 is more than the 576"):
        session.embed(["x"], dimensions=577)
    assert session.embed(["x"], dimensions=576).vectors.shape == (1, 576)  # its full length
    full = session.embed(["hello there"]).vectors
    cut = session.embed(["hello there"], dimensions=64).vectors
    assert cut.shape == (1, 64)
    np.testing.assert_allclose(cut, shortened(full, 64), atol=1e-6)


def test_declared_pooling_drives_session_embed(tmp_path: Path) -> None:
    """A GGUF declaring last-token pooling is embedded with it, end to end."""
    path = gguf_model(tmp_path, 3).path
    with open_session(str(path), backend="torch", slots=1, ctx=64, threads=1) as s:
        assert s.embedding_spec.pooling == "last"
        ids = [s.raw_prompt_ids("hello world"), s.raw_prompt_ids("a b c d e")]
        got = s.embed(["hello world", "a b c d e"]).vectors
        np.testing.assert_allclose(got, s.engine.runner.embed(ids, "last"), atol=1e-6)
        assert not np.allclose(got, s.engine.runner.embed(ids, "mean"), atol=1e-3)
