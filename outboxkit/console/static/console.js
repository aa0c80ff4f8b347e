// The outboxkit console's only script. Pages read the same without it: the overview then
// reloads itself (a <noscript> refresh), and forms post as forms do.
"use strict";

// The overview's figures, fetched again every few seconds and swapped in place (the server
// renders them; nothing here builds HTML). Paused while the tab is hidden.
function startLive(region) {
  const url = region.dataset.live;
  const every = Math.max(1, parseFloat(region.dataset.every || "5")) * 1000;
  let timer = null;
  async function refresh() {
    timer = null;
    try {
      const response = await fetch(url, {
        credentials: "same-origin",
        headers: { "X-Requested-With": "outboxkit-console" },
      });
      if (response.redirected || response.status === 401) {
        window.location.reload(); // the login ended: show the login page
        return;
      }
      if (response.ok) {
        region.innerHTML = await response.text();
        region.dataset.refreshed = String(Date.now());
      }
    } catch (error) {
      // The console is away for a moment: keep the last figures, try again later.
    }
    schedule();
  }
  function schedule() {
    if (timer === null && !document.hidden) {
      timer = window.setTimeout(refresh, every);
    }
  }
  document.addEventListener("visibilitychange", () => {
    if (document.hidden && timer !== null) {
      window.clearTimeout(timer);
      timer = null;
    } else {
      schedule();
    }
  });
  schedule();
}

// A header checkbox that ticks every box of its column.
function startSelectAll(box) {
  const name = box.dataset.selectAll;
  box.addEventListener("change", () => {
    for (const item of box.form.querySelectorAll(`input[type="checkbox"][name="${name}"]`)) {
      item.checked = box.checked;
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live]").forEach(startLive);
  document.querySelectorAll("[data-select-all]").forEach(startSelectAll);
});
