// arbor's web view: every element with data-live follows the server-sent
// event stream its attribute names and swaps in each fragment it pushes.
// The fragments are HTML the server rendered and escaped (html/template);
// nothing here builds markup from data.
"use strict";

(function () {
  const status = document.getElementById("live-status");
  function show(text, cls) {
    if (!status) return;
    status.hidden = false;
    status.textContent = text;
    status.className = "live-status " + cls;
  }

  for (const el of document.querySelectorAll("[data-live]")) {
    const source = new EventSource(el.dataset.live);
    source.addEventListener("open", () => show("live", "on"));
    source.addEventListener("fragment", (e) => {
      el.innerHTML = e.data;
      el.dataset.updated = String(Date.now());
      show("live", "on");
    });
    source.addEventListener("failed", (e) => show(e.data, "off"));
    // EventSource reconnects by itself; the next fragment is whole.
    source.addEventListener("error", () => show("reconnecting…", "off"));
  }
})();
