"""``mlflow ui --app-name lcfed``: MLflow's own server, whose UI opens in its model-training mode.

MLflow 3.17's UI decides between its GenAI and model-training modes in the browser alone: the address's
``workflowType`` parameter, else the browser's stored choice (``localStorage['mlflow.workflowType_v1']``),
GenAI until the user flips the sidebar's switch. An experiment's ``mlflow.experimentKind`` tag does not
enter into it (mlflow/mlflow#24498), nor does any server flag, so an address without the parameter, such as
``http://127.0.0.1:5000`` and a click on an experiment, opens GenAI's traces. This app serves the same UI
with one line added to its page: a browser that has made no choice yet starts in model training; a choice
made on the switch is kept. Registered as the ``mlflow.app`` entry point ``lcfed`` (``pyproject.toml``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

#: where MLflow's UI keeps the mode it opens in (its ``useLocalStorage`` key ``mlflow.workflowType``, version 1)
MODE_KEY = "mlflow.workflowType_v1"
MODE = "machine_learning"

#: the line added to the UI's page, ahead of MLflow's own script: model training unless a mode was chosen
_KEY, _MODE = json.dumps(MODE_KEY), json.dumps(json.dumps(MODE))
SCRIPT = f"<script>try{{localStorage.getItem({_KEY})||localStorage.setItem({_KEY},{_MODE})}}catch(e){{}}</script>".encode()

#: the paths that serve the UI's page
PAGES = ("/", "/index.html")

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


class ModelTrainingFirst:
    """An ASGI app: ``app``, with :data:`SCRIPT` in the ``<head>`` of the UI's page."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Message, receive: Callable[[], Awaitable[Message]], send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") not in PAGES:
            await self.app(scope, receive, send)
            return
        start: Message = {}
        body: list[bytes] = []

        async def edit(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            page = b"".join(body)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            if b"<head>" in page and not any(k.lower() == b"content-encoding" for k, _ in headers):
                page = page.replace(b"<head>", b"<head>" + SCRIPT, 1)
            await send({**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page})

        await self.app(scope, receive, edit)


def create_app() -> ModelTrainingFirst:
    """MLflow's server app (``mlflow.server.fastapi_app``) with its UI opening in model training."""
    from mlflow.server.fastapi_app import app  # the server's process only: MLflow builds its app on import

    return ModelTrainingFirst(app)
