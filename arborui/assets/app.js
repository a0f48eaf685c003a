// arbor's web view: every element with data-live follows the server-sent
// event stream its attribute names. A "fragment" replaces the element's
// content; an "append" (a log's new entries, newest first) goes at its
// top, and the element keeps no more than data-keep children, so that a
// page left open for a day holds what it held after a minute. The
// fragments are HTML the server rendered and escaped (html/template);
// nothing here builds markup from data. What a user typed into a field of
// a live element is kept across the fragments that replace it.
"use strict";

(function () {
  const status = document.getElementById("live-status");
  function show(text, cls) {
    if (!status) return;
    status.hidden = false;
    status.textContent = text;
    status.className = "live-status " + cls;
  }

  // What a user typed into a form field of a live element (an approval's
  // payload, say) outlives the fragment that replaces the element: the
  // fields are matched by their tag, id, name and data-payload, and the
  // value, the focus and the selection put back. A field the new fragment
  // no longer has (its await ended, its conversation left the page) is
  // dropped with it.
  // A checkbox (a conversation selected for a bulk action) is matched by
  // its value too, and keeps whether it is ticked.
  function isBox(f) {
    return f.type === "checkbox" || f.type === "radio";
  }
  function fieldKey(f) {
    return [f.tagName, f.id, f.name, f.dataset.payload || "", isBox(f) ? f.value : ""].join("|");
  }
  function keepTyped(el) {
    const kept = new Map();
    for (const f of el.querySelectorAll("input, textarea")) {
      const changed = isBox(f) ? f.checked !== f.defaultChecked : f.value !== f.defaultValue;
      if (changed || f === document.activeElement) {
        kept.set(fieldKey(f), {
          value: f.value,
          checked: f.checked,
          focused: f === document.activeElement,
          start: f.selectionStart,
          end: f.selectionEnd,
        });
      }
    }
    return () => {
      if (kept.size === 0) return;
      for (const f of el.querySelectorAll("input, textarea")) {
        const k = kept.get(fieldKey(f));
        if (!k) continue;
        if (isBox(f)) {
          f.checked = k.checked;
          if (k.focused) f.focus();
          continue;
        }
        f.value = k.value;
        if (k.focused) {
          f.focus();
          try {
            f.setSelectionRange(k.start, k.end);
          } catch (_) {
            // a field without a selection (not a text field)
          }
        }
      }
    };
  }

  for (const el of document.querySelectorAll("[data-live]")) {
    const source = new EventSource(el.dataset.live);
    const keep = Number(el.dataset.keep || 0);
    source.addEventListener("open", () => show("live", "on"));
    source.addEventListener("fragment", (e) => {
      const typed = keepTyped(el);
      el.innerHTML = e.data;
      typed();
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
