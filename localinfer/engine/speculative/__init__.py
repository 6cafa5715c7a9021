"""Speculative decoding: propose k tokens cheaply, verify them in one target forward.

- :mod:`.ngram` proposes by looking the last n tokens up in the prompt and output so far;
- :mod:`.draft` proposes with a second, smaller runner that shares the target's tokenizer;
- :mod:`.verification` accepts by exact match (greedy) or rejection sampling (sampled requests);
- :mod:`.adaptive` picks k per slot from its running acceptance rate;
- :mod:`.speculator` is what the scheduler talks to.
"""

from localinfer.engine.speculative.adaptive import AdaptiveK
from localinfer.engine.speculative.config import SpecConfig
from localinfer.engine.speculative.draft import DraftProposer, check_shared_tokenizer
from localinfer.engine.speculative.ngram import NgramIndex, NgramProposer
from localinfer.engine.speculative.proposal import Proposal
from localinfer.engine.speculative.speculator import Speculator
from localinfer.engine.speculative.verification import Verdict, verify

__all__ = [
    "AdaptiveK",
    "DraftProposer",
    "NgramIndex",
    "NgramProposer",
    "Proposal",
    "SpecConfig",
    "Speculator",
    "Verdict",
    "check_shared_tokenizer",
    "verify",
]
