// The dashboard's only script: an auto-refresh switch, remembered in this
// browser, and a confirmation before the buttons that delete.
(function () {
  "use strict";
  var box = document.getElementById("auto-refresh");
  var key = "dq-dashboard-refresh";
  var timer = null;
  function arm() {
    clearTimeout(timer);
    if (box.checked) {
      timer = setTimeout(function () { location.reload(); }, 5000);
    }
  }
  if (box) {
    try { box.checked = localStorage.getItem(key) === "on"; } catch (e) { /* storage off */ }
    box.addEventListener("change", function () {
      try { localStorage.setItem(key, box.checked ? "on" : "off"); } catch (e) { /* storage off */ }
      arm();
    });
    arm();
  }
  document.addEventListener("submit", function (ev) {
    var button = ev.submitter || ev.target.querySelector("button");
    var question = button && button.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      ev.preventDefault();
    }
  });
})();
