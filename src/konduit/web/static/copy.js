// konduit dashboard: copy buttons beside shortened ids.
//
// A shortened id shows its random tail (the start of a UUIDv7 is its timestamp, the same for
// every execution of a minute); its button copies the whole id, kept in data-copy. Where the
// clipboard is not available (a page served over plain http to another host), the whole id is
// shown selected instead, ready for Ctrl-C.
(function () {
  "use strict";

  function selectText(el) {
    var range = document.createRange();
    range.selectNodeContents(el);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function copied(button, text) {
    button.setAttribute("data-copied", "true");
    button.textContent = text;
    window.setTimeout(function () { button.textContent = "copy"; }, 1500);
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("button.copy[data-copy]") : null;
    if (!button) { return; }
    event.preventDefault();
    var value = button.getAttribute("data-copy");
    var full = button.parentNode.querySelector(".id-full");
    if (full) {
      full.hidden = false;
      selectText(full);
    }
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(value).then(function () { copied(button, "copied"); },
                                                function () { copied(button, "selected"); });
    } else {
      copied(button, "selected");
    }
  });
}());
