"""`localinfer serve`: the local OpenAI-compatible endpoint (FastAPI app + uvicorn host)."""

from localinfer.server.app import create_app
from localinfer.server.host import ServerThread, free_port

__all__ = ["ServerThread", "create_app", "free_port"]
