"""The server's JSON responses: Starlette's, except that text which is not valid Unicode still
makes a response.

JSON lets a body spell a lone UTF-16 surrogate ("\\ud800"); Python decodes it into a str that
UTF-8 cannot encode. Answers echo request text (an unknown model's name in a 404, a Responses
object's ``instructions`` and ``tools``), and Starlette's UTF-8 rendering then raised, turning a
client's odd byte into a 500. Such an answer is written with ASCII escapes instead, so the
client gets back exactly the escape it sent.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse


class SafeJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(
                content, ensure_ascii=True, allow_nan=False, indent=None, separators=(",", ":")
            ).encode("ascii")
