"""The pages' template environment: its own module, so that the modules that render an error
page or the login form (problems, login, the API's docs) import it from below the app instead of
reaching up into :mod:`konduit.web.app`, which imports them."""

from __future__ import annotations

import json
from typing import Any, cast

from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, pass_eval_context, select_autoescape
from jinja2.nodes import EvalContext
from markupsafe import Markup

from konduit.core.durations import format_duration
from konduit.core.ids import short_id
from konduit.web import views

env = Environment(loader=PackageLoader("konduit.web", "templates"),
                  autoescape=select_autoescape(["html"]))
_tojson = env.filters["tojson"]


@pass_eval_context
def _tojson_unsealed(eval_ctx: EvalContext, value: Any, indent: int | None = None) -> Markup:
    """Jinja's ``tojson``, with payloads this server cannot open shown as "encrypted"."""
    return cast(Markup, _tojson(eval_ctx, views.unsealed(value), indent))


env.filters.update(secs=views.secs, last_line=views.last_line,
                   pretty=lambda v: json.dumps(views.unsealed(v), indent=2, default=str,
                                               ensure_ascii=False),
                   tojson=_tojson_unsealed,
                   clock=lambda t: "—" if t is None else t.astimezone().strftime("%Y-%m-%d %H:%M:%S"),
                   n=lambda v: f"{v:.1f}", short_id=short_id)
env.filters["from_now"] = views.from_now
env.globals["span"] = format_duration
templates = Jinja2Templates(env=env)
