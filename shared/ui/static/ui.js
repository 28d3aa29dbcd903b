// Hands each chart on the page the option the server built for it (shared/ui/views.py), and
// asks for it again when the page's event stream says what it shows has changed. Drawing is
// ECharts' own; this file only fetches.
(function () {
  "use strict";

  async function draw(element) {
    const chart = echarts.getInstanceByDom(element) || echarts.init(element);
    const response = await fetch(element.dataset.chart, { headers: { Accept: "application/json" } });
    if (!response.ok) {
      element.dataset.problem = String(response.status);
      return;
    }
    chart.setOption(await response.json(), { notMerge: true });
    // How many times it was drawn: what a browser test waits on.
    element.dataset.drawn = String(Number(element.dataset.drawn || "0") + 1);
  }

  function drawAll() {
    document.querySelectorAll("[data-chart]").forEach(function (element) {
      draw(element).catch(function (error) {
        element.dataset.problem = String(error);
      });
    });
  }

  document.addEventListener("DOMContentLoaded", drawAll);
  document.addEventListener("htmx:sseMessage", drawAll);
  // What changed between the page's render and its event stream's (re)opening.
  document.addEventListener("htmx:sseOpen", drawAll);
  window.addEventListener("resize", function () {
    document.querySelectorAll("[data-chart]").forEach(function (element) {
      const chart = echarts.getInstanceByDom(element);
      if (chart) chart.resize();
    });
  });
})();
