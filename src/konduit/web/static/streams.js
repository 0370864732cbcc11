// konduit dashboard: follow an execution's durable streams (ctx.stream) live on its page.
//
// Each <section class="stream" data-events-url="..."> opens an EventSource on the API's
// server-sent events (GET /api/v1/executions/{id}/streams/{name}): one event per record, its
// id the record's offset, so a dropped connection reconnects with Last-Event-ID and goes on
// after the last record shown (none twice, none lost). An "end" event closes it. While the
// execution runs (#streams[data-discover]), the list of streams is read again every few
// seconds and a stream written since the page loaded gets its own section. Only textContent
// is written (never HTML): what a handler wrote stays text.
(function () {
  "use strict";

  var box = document.getElementById("streams");
  if (!box || !window.EventSource) { return; }
  var following = {};

  function text(record) {
    if (record.kind === "restart") {
      return "\u2014 attempt " + record.attempt + " started again here (after attempt " +
        record.previous_attempt + ") \u2014";
    }
    return typeof record.data === "string" ? record.data : JSON.stringify(record.data);
  }

  function follow(section) {
    var name = section.getAttribute("data-stream");
    if (following[name]) { return; }
    following[name] = true;
    var records = section.querySelector(".stream-records");
    var count = section.querySelector(".stream-count");
    var state = section.querySelector(".stream-state");
    var source = new EventSource(section.getAttribute("data-events-url"));

    function add(event) {
      var record = JSON.parse(event.data);
      var line = document.createElement("div");
      line.className = "stream-record " + record.kind;
      line.setAttribute("data-offset", String(record.offset));
      line.textContent = record.offset + "  " + text(record);
      records.appendChild(line);
      if (count) { count.textContent = String(record.offset + 1); }
      if (state) { state.textContent = "live"; }
    }

    source.addEventListener("data", add);
    source.addEventListener("restart", add);
    source.addEventListener("end", function () {
      source.close();
      if (state) { state.textContent = "ended"; }
      section.setAttribute("data-ended", "1");
    });
    source.addEventListener("error", function (event) {
      if (event.data) {  // the server's own error event: said, then closed
        source.close();
        if (state) { state.textContent = "error: " + JSON.parse(event.data).detail; }
      } else if (state) {
        state.textContent = "reconnecting";  // EventSource retries with Last-Event-ID
      }
    });
  }

  function section(stream) {
    var el = document.createElement("section");
    el.className = "stream";
    el.setAttribute("data-stream", stream.name);
    el.setAttribute("data-events-url",
      box.getAttribute("data-streams-url") + "/" + encodeURIComponent(stream.name));
    var head = document.createElement("h3");
    head.textContent = stream.name + " ";
    var small = document.createElement("span");
    small.className = "muted small";
    var count = document.createElement("span");
    count.className = "stream-count";
    count.textContent = "0";
    var state = document.createElement("span");
    state.className = "stream-state";
    state.textContent = "live";
    small.appendChild(document.createTextNode("step " + stream.step + " \u00b7 "));
    small.appendChild(count);
    small.appendChild(document.createTextNode(" record(s) \u00b7 "));
    small.appendChild(state);
    head.appendChild(small);
    var records = document.createElement("pre");
    records.className = "log stream-records";
    el.appendChild(head);
    el.appendChild(records);
    return el;
  }

  function discover() {
    if (!window.fetch) { return; }
    fetch(box.getAttribute("data-streams-url"), {credentials: "same-origin"})
      .then(function (answer) { return answer.ok ? answer.json() : []; })
      .then(function (streams) {
        for (var i = 0; i < streams.length; i++) {
          if (following[streams[i].name]) { continue; }
          var none = document.getElementById("no-streams");
          if (none) { none.parentNode.removeChild(none); }
          var el = section(streams[i]);
          box.appendChild(el);
          follow(el);
        }
      })
      .catch(function () { /* the next round tries again */ });
  }

  var sections = box.querySelectorAll("section.stream");
  for (var i = 0; i < sections.length; i++) { follow(sections[i]); }
  if (box.getAttribute("data-discover")) {
    discover();
    setInterval(discover, 2000);
  }
})();
