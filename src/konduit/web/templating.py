"""The pages' template environment: its own module, so that the modules that render an error
page or the login form (problems, login, the API's docs) import it from below the app instead of
reaching up into :mod:`konduit.web.app`, which imports them."""

from __future__ import annotations

import json

from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, select_autoescape

from konduit.core.durations import format_duration
from konduit.core.ids import short_id
from konduit.web import views

env = Environment(loader=PackageLoader("konduit.web", "templates"),
                  autoescape=select_autoescape(["html"]))
_tojson = env.filters["tojson"]
env.filters.update(secs=views.secs, last_line=views.last_line,
                   pretty=lambda v: json.dumps(views.unsealed(v), indent=2, default=str,
                                               ensure_ascii=False),
                   tojson=lambda v, *a: _tojson(views.unsealed(v), *a),
                   clock=lambda t: "—" if t is None else t.astimezone().strftime("%Y-%m-%d %H:%M:%S"),
                   n=lambda v: f"{v:.1f}", short_id=short_id)
env.filters["from_now"] = views.from_now
env.globals["span"] = format_duration
templates = Jinja2Templates(env=env)
