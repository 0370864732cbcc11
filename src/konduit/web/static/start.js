// konduit dashboard: the start form.
//
// Choosing another workflow shows the fields of its input (the page is asked for again, for that
// workflow); "fields" / "raw JSON" shows the one the form sends. Without this script both show,
// and the choice of the radio buttons is what the server reads.
(function () {
  "use strict";

  function showMode(form) {
    var raw = form.querySelector("#mode-raw");
    var fields = form.querySelector("#start-fields");
    var box = form.querySelector("#start-raw");
    if (!raw || !fields || !box) { return; }
    fields.hidden = raw.checked;
    box.hidden = !raw.checked;
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = document.getElementById("start-form");
    if (!form) { return; }
    var workflow = form.querySelector("#start-workflow");
    if (workflow) {
      workflow.addEventListener("change", function () {
        window.location.assign("/start?workflow=" + encodeURIComponent(workflow.value));
      });
    }
    form.addEventListener("change", function (event) {
      if (event.target && event.target.name === "mode") { showMode(form); }
    });
    showMode(form);
  });
}());
