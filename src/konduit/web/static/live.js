// konduit dashboard: live updates without reloading the page.
//
// A page that wants them names its JSON in <main data-live="..." data-poll-ms="...">; this script
// polls it and updates status cells, DAG nodes and counters in place. Only textContent and
// attributes are written (never HTML), so a hostile step name or error stays text. Served as a
// static file: the pages carry no inline script (Content-Security-Policy).
(function () {
  "use strict";

  var main = document.querySelector("main[data-live]");
  if (!main || !window.fetch) { return; }
  var url = main.getAttribute("data-live");
  var every = parseInt(main.getAttribute("data-poll-ms"), 10) || 2000;

  function byData(selector, name, value) {
    var found = document.querySelectorAll(selector);
    for (var i = 0; i < found.length; i++) {
      if (found[i].getAttribute(name) === value) { return found[i]; }
    }
    return null;
  }

  function setBadge(el, status) {
    if (!el || el.getAttribute("data-status") === status && el.textContent === status) { return; }
    el.textContent = status;
    // Only the status class changes: the badge keeps any other class it has (.status, ...).
    el.className = /\bs-[a-z_]+/.test(el.className) ?
      el.className.replace(/\bs-[a-z_]+/, "s-" + status) : el.className + " s-" + status;
    el.setAttribute("data-status", status);
  }

  function setText(el, text) {
    if (el && el.textContent !== text) { el.textContent = text; }
  }

  function stripUpdate(strip) {
    var box = document.getElementById("strip");
    if (!box || !strip) { return; }
    setText(document.getElementById("strip-running"), String(strip.running));
    setText(document.getElementById("strip-workers"), String(strip.workers_alive));
    var body = document.getElementById("queues-body");
    if (!body) { return; }
    while (body.firstChild) { body.removeChild(body.firstChild); }
    strip.queues.forEach(function (q) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-queue", q.queue);
      tr.setAttribute("data-workflow", q.workflow);
      [q.queue, q.workflow, String(q.ready), String(q.due), q.oldest === null ? "—" : q.oldest]
        .forEach(function (text, i) {
          var td = document.createElement("td");
          td.textContent = text;
          if (i >= 2) { td.className = "num"; }
          tr.appendChild(td);
        });
      body.appendChild(tr);
    });
    var none = document.getElementById("queues-empty");
    if (none) { none.hidden = strip.queues.length > 0; }
  }

  function execution(state) {
    setBadge(document.getElementById("status"), state.status);
    Object.keys(state.steps).forEach(function (name) {
      var step = state.steps[name];
      var node = byData("#dag g.node", "data-step", name);
      if (node && node.getAttribute("data-status") !== step.status) {
        node.setAttribute("data-status", step.status);
        node.setAttribute("class", "node s-" + step.status);
      }
      if (node) {
        setText(node.querySelector("text.detail"), step.detail + (node.getAttribute("data-join") ?
          " · " + node.getAttribute("data-join") : ""));
      }
      var row = byData("#steps tr", "data-step", name);
      if (row) {
        setBadge(row.querySelector(".badge"), step.status);
        if (step.map) {
          var counts = Object.keys(step.map.counts).map(function (s) {
            return step.map.counts[s] + " " + s;
          });
          setText(row.querySelector(".map-counts"), counts.join(" · "));
        }
      }
    });
    if (state.finished) {
      // The output, the final timeline and the tracebacks are drawn by the server: show them.
      window.location.reload();
      return false;
    }
    return true;
  }

  // Seconds as the server writes them (konduit.core.durations.format_elapsed).
  function elapsed(seconds) {
    seconds = Math.max(seconds, 0);
    if (seconds < 10) { return seconds.toFixed(3) + "s"; }
    if (seconds < 60) { return seconds.toFixed(1) + "s"; }
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    if (seconds < 3600) {
      var s = Math.round(seconds);
      return Math.floor(s / 60) + "m" + pad(s % 60) + "s";
    }
    var whole = Math.round(seconds);
    if (seconds < 2 * 86400) {
      return Math.floor(whole / 3600) + "h" + pad(Math.floor((whole % 3600) / 60)) + "m";
    }
    var rest = whole % 86400;
    return Math.floor(whole / 86400) + "d" + (rest >= 3600 ? Math.floor(rest / 3600) + "h" : "");
  }

  // A page of /api/v1/executions: the rows shown (same filters and cursor) as they are now.
  function list(page) {
    var strip = main.getAttribute("data-live-strip");
    if (strip) {
      fetch(strip, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(stripUpdate)
        .catch(function () { /* the next poll tries again */ });
    }
    page.items.forEach(function (e) {
      var row = byData("#executions tr", "data-id", e.id);
      if (!row) { return; }
      var finished = e.finished_at !== null;
      var end = finished ? Date.parse(e.finished_at) : Date.now();
      row.setAttribute("data-status", e.status);
      row.setAttribute("data-finished", finished ? "true" : "false");
      setBadge(row.querySelector(".badge.status"), e.status);
      setText(row.querySelector(".took"), elapsed((end - Date.parse(e.created_at)) / 1000));
      if (finished) { setText(row.querySelector(".so-far"), ""); }
    });
    return true;
  }

  function workers(state) {
    stripUpdate(state.strip);
    var shown = document.querySelectorAll("#workers tr[data-worker]");
    if (shown.length !== state.workers.length) { window.location.reload(); return false; }
    state.workers.forEach(function (w) {
      var row = byData("#workers tr", "data-worker", w.id);
      if (!row) { window.location.reload(); return; }
      var badge = row.querySelector(".state");
      if (badge && badge.textContent !== w.state) {
        badge.textContent = w.state;
        badge.className = "badge state state-" + w.state;
        row.setAttribute("data-state", w.state);
      }
      setText(row.querySelector(".slots"), w.running + "/" + w.concurrency);
      setText(row.querySelector(".abandoned"), String(w.abandoned));
      setText(row.querySelector(".heartbeat"), w.heartbeat);
      setText(row.querySelector(".attempts-count"), String(w.attempts.length));
    });
    return true;
  }

  var apply = /\/live\.json$/.test(url) ? execution : /\/workers\.json$/.test(url) ? workers : list;

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (state) {
        main.setAttribute("data-live-at", String(Date.now()));
        if (apply(state) !== false) { window.setTimeout(poll, every); }
      })
      .catch(function () {
        // The database or the server is away: keep the page, try again a little later.
        main.setAttribute("data-live-error", String(Date.now()));
        window.setTimeout(poll, every * 2);
      });
  }

  window.setTimeout(poll, every);
}());
