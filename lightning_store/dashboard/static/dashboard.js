// lightning-store dashboard: charts (uPlot) from JSON the page carries, the login form, and nothing else.
// Every page works without this script except the charts and the login.
"use strict";

const WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];
const PALETTE = ["#3457d5", "#d5573b", "#1f8a4c", "#9f7aea", "#b7791f", "#2b6cb0", "#c05621", "#4a5568"];

// A chart: <div data-chart="NAME"> beside <script type="application/json" id="chart-NAME">
// {"x": [...], "series": {"label": [...], ...}, "x_label": "step"|null}. x is seconds since the epoch unless
// x_label names another axis; a null value is a gap.
function drawChart(el) {
  const source = document.getElementById("chart-" + el.dataset.chart);
  if (!source || typeof uPlot === "undefined") return;
  const data = JSON.parse(source.textContent);
  const names = Object.keys(data.series || {});
  if (!data.x || data.x.length === 0 || names.length === 0) return;
  const isTime = !data.x_label;
  const bars = el.dataset.kind === "bars";
  const series = [{ label: data.x_label || "time" }].concat(names.map((name, i) => ({
    label: name,
    stroke: PALETTE[i % PALETTE.length],
    width: 2,
    points: { show: data.x.length < 40 },
    spanGaps: true,
    paths: bars && uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.6, 40] }) : undefined,
    fill: bars ? PALETTE[i % PALETTE.length] + "55" : undefined,
  })));
  const width = Math.max(280, el.clientWidth - 12);
  const options = {
    width: width,
    height: Number(el.dataset.height || 200),
    series: series,
    scales: { x: { time: isTime } },
    // Whole-number x (steps, rounds) gets whole-number ticks: there is no step 0.5.
    axes: [{ label: isTime ? undefined : data.x_label, incrs: !isTime && data.x.every(Number.isInteger) ? WHOLE : undefined }, {}],
    legend: { live: true },
  };
  el.replaceChildren();
  if (el.dataset.title) {
    const title = document.createElement("h3");
    title.textContent = el.dataset.title;
    el.appendChild(title);
  }
  const plot = new uPlot(options, [data.x].concat(names.map((n) => data.series[n])), el);
  el.dataset.drawn = "true";
  return plot;
}

function drawCharts(root) {
  (root || document).querySelectorAll("[data-chart]:not([data-drawn])").forEach((el) => drawChart(el));
}

// Login: the token from the URL fragment (#token=…, never sent to the server) or from the form, posted once as
// JSON; the server answers with a cookie. The fragment is removed from the address bar and history.
function setUpLogin() {
  const form = document.getElementById("login-form");
  if (!form) return;
  const next = form.dataset.next || "/dashboard/";
  async function submit(token) {
    const response = await fetch("/dashboard/login", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: token }),
      credentials: "same-origin",
    });
    if (response.ok) {
      window.location.replace(next);
    } else {
      document.getElementById("login-error").hidden = false;
    }
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit(document.getElementById("token").value);
  });
  const match = window.location.hash.match(/(?:^#|&)token=([^&]*)/);
  if (match) {
    history.replaceState(null, "", window.location.pathname + window.location.search);
    submit(decodeURIComponent(match[1]));
  }
}

document.addEventListener("DOMContentLoaded", () => {
  setUpLogin();
  drawCharts(document);
});
// Parts that htmx swaps in (the live overview, lazily loaded panels) draw their own charts.
document.addEventListener("htmx:afterSettle", () => drawCharts(document));
