// jixu Studio: live updates. The page polls its own /head endpoint; when the thread or run moved on, it
// reloads itself — unless you are typing into a form, in which case it says so and waits for you.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main || !main.dataset.head) { return; }
  var seq = main.dataset.seq, status = main.dataset.status, dirty = false, announced = false;
  document.addEventListener("input", function () { dirty = true; });
  function busy() {
    var active = document.activeElement;
    return dirty || (active && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName) && active.type !== "hidden");
  }
  function poll() {
    fetch(main.dataset.head, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (head) {
        if (head && (String(head.seq) !== seq || head.status !== status)) {
          if (!busy()) { window.location.reload(); return; }
          if (!announced) {
            announced = true;
            var note = document.getElementById("live");
            if (note) { note.textContent = "New events arrived (now " + head.status + "). Reload the page to see them."; }
          }
        }
        window.setTimeout(poll, 1000);
      })
      .catch(function () { window.setTimeout(poll, 3000); });
  }
  window.setTimeout(poll, 1000);
})();
