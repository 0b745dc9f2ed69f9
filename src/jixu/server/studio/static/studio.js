// jixu Studio: live pages that never reload (decision 0038). A thread page follows its thread's server-sent
// stream, a run page polls its head, a list refreshes every few seconds; on a change the page fetches itself
// and replaces only its live parts ([data-live]) in place: open details stay open, and a part holding the
// form you are filling in (or the focus) is left as it is until you send or leave it.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main || !(main.dataset.stream || main.dataset.head || main.dataset.refresh)) { return; }
  var dirty = [], rendered = {}, fetching = false, again = false, timer = null;
  document.addEventListener("input", function (event) {
    var form = event.target && event.target.form;
    if (form && dirty.indexOf(form) < 0) { dirty.push(form); }
  });
  function note(text) {
    var live = document.getElementById("live");
    if (live && live.textContent !== text) { live.textContent = text; }
  }
  function held(region) {
    var active = document.activeElement;
    if (active && region.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) { return true; }
    for (var i = 0; i < dirty.length; i++) { if (region.contains(dirty[i])) { return true; } }
    return false;
  }
  function focusKey(element) {  // how to find the focused element again in a replaced part
    if (!element || element === document.body) { return null; }
    if (element.id) { return "#" + CSS.escape(element.id); }
    var parent = element.parentElement;
    if (element.tagName === "SUMMARY" && parent && parent.id) { return "#" + CSS.escape(parent.id) + " > summary"; }
    if (element.tagName === "A" && element.getAttribute("href")) {
      return "a[href=\"" + CSS.escape(element.getAttribute("href")) + "\"]";
    }
    return null;
  }
  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    var next = fresh.getElementById("main");
    if (!next) { return; }
    var kept = 0;
    Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), function (old) {
      var replacement = fresh.getElementById(old.id);
      if (!replacement || replacement.innerHTML === rendered[old.id]) { return; }
      if (held(old)) { kept++; return; }
      var open = {};
      Array.prototype.forEach.call(old.querySelectorAll("details[id]"), function (d) { open[d.id] = d.open; });
      Array.prototype.forEach.call(replacement.querySelectorAll("details[id]"), function (d) {
        if (Object.prototype.hasOwnProperty.call(open, d.id)) { d.open = open[d.id]; }
      });
      rendered[old.id] = replacement.innerHTML;
      var active = document.activeElement, key = old.contains(active) ? focusKey(active) : null;
      var adopted = document.importNode(replacement, true);
      old.parentNode.replaceChild(adopted, old);
      var refocus = key && adopted.querySelector(key);
      if (refocus) { refocus.focus({ preventScroll: true }); }
    });
    main.dataset.seq = next.dataset.seq || "";
    main.dataset.status = next.dataset.status || "";
    note(kept ? "New events arrived. The part with the form you are filling in is kept as it was; it updates " +
                "when you send the form or leave it." : "");
  }
  function refresh() {
    if (fetching) { again = true; return; }
    fetching = true;
    fetch(window.location.pathname + window.location.search, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.redirected || response.status === 401) { note("Your session has ended: log in again to see new events."); return null; }
        return response.ok ? response.text() : null;
      })
      .then(function (html) { if (html) { swap(html); } })
      .catch(function () { note("The server cannot be reached; the page shows what it last knew."); })
      .then(function () {
        fetching = false;
        if (again) { again = false; soon(); }
      });
  }
  function soon() {  // several events in a burst: one refresh
    if (timer === null) { timer = window.setTimeout(function () { timer = null; refresh(); }, 250); }
  }
  Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), function (region) {
    rendered[region.id] = region.innerHTML;
  });
  function poll(url, every) {
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (head) {
        if (head && (String(head.seq) !== main.dataset.seq || head.status !== main.dataset.status
                     || (head.live !== undefined && String(head.live) !== (main.dataset.live || "")))) { soon(); }
        window.setTimeout(function () { poll(url, every); }, every);
      })
      .catch(function () { window.setTimeout(function () { poll(url, every); }, every * 3); });
  }
  if (main.dataset.stream && window.EventSource) {
    var source = new EventSource(main.dataset.stream + "?after_seq=" + encodeURIComponent(main.dataset.seq || "0"));
    source.onmessage = function (event) {
      var head = JSON.parse(event.data);
      if (String(head.seq) !== main.dataset.seq || (head.status && head.status !== main.dataset.status)) { soon(); }
    };
    source.addEventListener("ended", function () {
      source.close();
      note("Your session may no longer read this thread: live updates stopped.");
    });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED && main.dataset.head) { poll(main.dataset.head, 3000); }
    };
  } else if (main.dataset.head) {
    poll(main.dataset.head, 1000);
  } else if (main.dataset.refresh) {
    window.setInterval(function () { if (document.visibilityState !== "hidden") { refresh(); } },
                       Number(main.dataset.refresh));
  }
})();
