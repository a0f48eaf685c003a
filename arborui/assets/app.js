// arbor's web view: every element with data-live follows the server-sent
// event stream its attribute names. A "fragment" replaces the element's
// content; an "append" (a log's new entries, newest first) goes at its
// top, and the element keeps no more than data-keep children, so that a
// page left open for a day holds what it held after a minute. The
// fragments are HTML the server rendered and escaped (html/template);
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
    const keep = Number(el.dataset.keep || 0);
    source.addEventListener("open", () => show("live", "on"));
    source.addEventListener("fragment", (e) => {
      el.innerHTML = e.data;
      el.dataset.updated = String(Date.now());
      show("live", "on");
    });
    source.addEventListener("append", (e) => {
      el.insertAdjacentHTML("afterbegin", e.data);
      while (keep > 0 && el.children.length > keep) {
        el.lastElementChild.remove();
      }
      el.dataset.updated = String(Date.now());
      show("live", "on");
    });
    source.addEventListener("failed", (e) => show(e.data, "off"));
    // EventSource reconnects by itself; the next fragment is whole (an
    // appending stream starts again after the cursor its address names,
    // so an entry may show twice after a reconnect, never be missed).
    source.addEventListener("error", () => show("reconnecting…", "off"));
  }
})();
