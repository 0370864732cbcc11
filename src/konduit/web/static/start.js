// konduit dashboard: the forms built from a JSON Schema (start, send event).
//
// Choosing another workflow shows the fields of its input (the page is asked for again, for that
// workflow); "fields" / "raw JSON" shows the one the form sends. Without this script the mode
// chosen when the page was made shows, and the choice of the radio buttons is what the server
// reads.
(function () {
  "use strict";

  function showMode(form) {
    var raw = form.querySelector("input[name=mode][value=raw]");
    var fields = form.querySelector("[data-mode=fields]");
    var box = form.querySelector("[data-mode=raw]");
    if (!raw || !fields || !box) { return; }
    fields.hidden = raw.checked;
    box.hidden = !raw.checked;
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form.schema-form").forEach(function (form) {
      form.addEventListener("change", function (event) {
        if (event.target && event.target.name === "mode") { showMode(form); }
      });
      showMode(form);
    });
    var form = document.getElementById("start-form");
    if (!form) { return; }
    var workflow = form.querySelector("#start-workflow");
    if (workflow) {
      workflow.addEventListener("change", function () {
        window.location.assign("/start?workflow=" + encodeURIComponent(workflow.value));
      });
    }
  });
}());
