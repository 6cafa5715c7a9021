"""The chat's model keys: settings (Ctrl+S) and the model picker (Ctrl+L), and loading a model
in a worker with what to do next when that fails."""

from __future__ import annotations

import gc

from textual import on, work

from localinfer.tui.app_base import LOADING_PLACEHOLDER, ChatAppBase
from localinfer.tui.failure_text import error_text, load_hint
from localinfer.tui.messages import ModelChoicesReady, ModelLoaded, ModelLoadFailed
from localinfer.tui.model_picker import ModelPickerScreen
from localinfer.tui.settings import RELOAD_FIELDS, ChatSettings
from localinfer.tui.settings_screen import SettingsScreen
from localinfer.tui.think_switch import UNKNOWN


class ModelActions(ChatAppBase):
    def action_settings(self) -> None:
        if self.loading:
            self.notify("A model is loading; settings open when it is ready.", severity="warning")
            return
        support = self.host.thinking_support() if self.host.loaded else UNKNOWN
        self.push_screen(SettingsScreen(self.host.settings, support), self.apply_settings)

    def apply_settings(self, settings: ChatSettings | None) -> None:
        if settings is None or settings == self.host.settings:
            return
        if self.host.remote_url is not None and self.host.settings.reload_needed(settings):
            # The model's set-up is the server's: keep what applies to the next message.
            kept = {f: getattr(self.host.settings, f) for f in RELOAD_FIELDS}
            settings = settings.changed(**kept)
            self.notify(
                f"Context, slots, quantization, backend and speculation are set where "
                f"`localinfer serve` runs ({self.host.remote_url}); sampling settings apply.",
                severity="warning",
            )
            if settings == self.host.settings:
                return
        if self.host.settings.reload_needed(settings):
            if self.answering:
                self.notify("Stop the answer first (Esc), then apply.", severity="warning")
                return
            self._start_load(settings)
        else:
            self.host.settings = settings
            self.settings_summary.update(settings.describe())
            self.notify("Settings apply from the next message.")

    def action_pick_model(self) -> None:
        if self.host.remote_url is not None:
            self.notify(
                f"The model is chosen where `localinfer serve` runs ({self.host.remote_url}); "
                "name a served one after --url, or run the chat without --url to pick here.",
                severity="warning",
            )
            return
        if self.loading:
            self.notify("A model is loading already.", severity="warning")
            return
        self._set_status("Checking which models fit…", busy=True)
        self.list_models(self.host.settings.ctx)

    @work(thread=True, exclusive=True, group="models")
    def list_models(self, ctx: int) -> None:
        try:
            choices = self.host.model_choices(ctx)
        except Exception as exc:  # noqa: BLE001
            error = f"could not list models: {error_text(exc)}"
            self.post_message(ModelLoadFailed(error, "try again (Ctrl+L)", self.host.loaded))
            return
        self.post_message(ModelChoicesReady(choices, ctx))

    @on(ModelChoicesReady)
    def on_model_choices_ready(self, message: ModelChoicesReady) -> None:
        self._set_status(self._idle_status())
        self.push_screen(ModelPickerScreen(message.choices, message.ctx), self._pick)

    def _pick(self, name: str | None) -> None:
        if name is None:
            return
        if self.answering:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self._start_load(self.host.settings.changed(model=name))

    def _start_load(self, settings: ChatSettings) -> None:
        gc.unfreeze()  # the model being replaced must be collectable (app_base._set_ready)
        self.loading = True
        name = settings.model or "the embedded model"
        doing = f"Loading {name}"
        if self.host.remote_url is not None:
            doing = f"Attaching to {self.host.remote_url}"
        self._set_status(f"{doing}…", busy=True)
        self.prompt.placeholder = LOADING_PLACEHOLDER
        self.load_model(settings)

    @work(thread=True, exclusive=True, group="load")
    def load_model(self, settings: ChatSettings) -> None:
        try:
            self.host.load(settings)
        except Exception as exc:  # noqa: BLE001 - shown in the UI with what to do next
            hint = getattr(exc, "hint", None) or load_hint(exc)
            self.post_message(ModelLoadFailed(error_text(exc), hint, self.host.loaded))
            return
        self.post_message(ModelLoaded(self.host.describe(), self.host.notice()))

    @on(ModelLoaded)
    def on_model_loaded(self, message: ModelLoaded) -> None:
        self._set_ready(message.description, message.notice)
        # The budget's prediction takes a moment (it reads file headers): after "Ready", not before.
        self.refresh_memory()

    @on(ModelLoadFailed)
    def on_model_load_failed(self, message: ModelLoadFailed) -> None:
        self.loading = False
        view = self.view
        if message.still_loaded:
            self._set_ready(self.host.describe(), None)
            view.add_notice(
                f"{message.error}. Still using {self.host.model_name()}; {message.hint}.",
                error=True,
            )
        else:
            remote = self.host.remote_url
            self._set_status("No model loaded" if remote is None else f"Not attached to {remote}")
            failed = "Could not load a model" if remote is None else f"Could not attach to {remote}"
            view.add_notice(f"{failed}: {message.error}. Next: {message.hint}.", error=True)
