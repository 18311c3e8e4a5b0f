// Small hand-drawn SVG line charts: the dashboard's time series need lines,
// an axis maximum, a legend and a hover read-out, which is less code than
// vendoring a library.

const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#2f6fde", "#c0362c", "#1a7f37", "#a36a00", "#7b3fb0", "#0f8a8a", "#6b7585", "#d4569b"];

function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// A chart's size and margins (left, bottom, top, right), in SVG units.
const W = 420, H = 130, L = 44, B = 18, T = 6, R = 6;

// chartFrame returns a chart's figure, captioned with its title, and its
// empty SVG (attrs added to the SVG's own).
function chartFrame(title, attrs) {
  const fig = document.createElement("figure");
  fig.className = "chart";
  const cap = document.createElement("figcaption");
  cap.textContent = title;
  fig.append(cap);
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": title, ...attrs });
  return { fig, svg };
}

// lineChart returns a figure with one line per series. times are Date
// objects; each series is {name, values} with values aligned to times (null
// for a gap).
export function lineChart(title, times, series, unit) {
  const { fig, svg } = chartFrame(title, {});
  let max = 0;
  for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
  if (max <= 0) max = 1;
  const t0 = times.length ? times[0].getTime() : 0;
  const t1 = times.length ? times[times.length - 1].getTime() : 1;
  const x = (t) => L + ((W - L - R) * (t.getTime() - t0)) / Math.max(1, t1 - t0);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  svg.append(el("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
  svg.append(el("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
  svg.append(el("text", { x: L - 4, y: T + 8, "text-anchor": "end", class: "tick" }, fmt(max) + (unit || "")));
  svg.append(el("text", { x: L - 4, y: H - B, "text-anchor": "end", class: "tick" }, "0"));
  if (times.length) {
    svg.append(el("text", { x: L, y: H - 4, class: "tick" }, times[0].toLocaleTimeString()));
    svg.append(el("text", { x: W - R, y: H - 4, "text-anchor": "end", class: "tick" }, times[times.length - 1].toLocaleTimeString()));
  }
  series.forEach((s, i) => {
    let d = "";
    s.values.forEach((v, j) => {
      if (v === null || v === undefined) return;
      d += (d && s.values[j - 1] !== null && s.values[j - 1] !== undefined ? "L" : "M") + x(times[j]).toFixed(1) + " " + y(v).toFixed(1);
    });
    if (d) svg.append(el("path", { d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.5, "data-series": s.name }));
  });
  fig.append(svg);
  hover(fig, svg, times, series, unit, x, W, T, H - B);
  const legend = document.createElement("div");
  legend.className = "legend";
  series.forEach((s, i) => {
    const last = [...s.values].reverse().find((v) => v !== null && v !== undefined);
    const item = document.createElement("span");
    item.style.color = COLORS[i % COLORS.length];
    item.textContent = `${s.name} ${last === undefined ? "–" : fmt(last) + (unit || "")}`;
    legend.append(item);
  });
  fig.append(legend);
  return fig;
}

// pointer is where the pointer rests on a line chart (its title and the
// last mousemove), so a chart redrawn by the 2 s refresh shows its tooltip
// again at once instead of dropping it.
let pointer = null;

// hover shows, under the pointer, a cursor line and each series' value at
// the nearest point in time.
function hover(fig, svg, times, series, unit, x, W, top, bottom) {
  if (!times.length) return;
  const title = fig.querySelector("figcaption").textContent;
  const cursor = el("line", { y1: top, y2: bottom, class: "cursor", visibility: "hidden" });
  const overlay = el("rect", { x: 0, y: 0, width: W, height: bottom, fill: "transparent", class: "hover" });
  svg.append(cursor, overlay);
  const tip = document.createElement("div");
  tip.className = "tooltip";
  tip.hidden = true;
  fig.append(tip);
  overlay.addEventListener("mousemove", (ev) => {
    pointer = { title, clientX: ev.clientX, clientY: ev.clientY };
    const box = svg.getBoundingClientRect();
    const px = ((ev.clientX - box.left) * W) / box.width;
    let j = 0;
    for (let i = 1; i < times.length; i++) if (Math.abs(x(times[i]) - px) < Math.abs(x(times[j]) - px)) j = i;
    const cx = x(times[j]).toFixed(1);
    cursor.setAttribute("x1", cx);
    cursor.setAttribute("x2", cx);
    cursor.setAttribute("visibility", "visible");
    const head = document.createElement("strong");
    head.textContent = times[j].toLocaleTimeString();
    const rows = series.map((s, i) => {
      const row = document.createElement("div");
      const name = document.createElement("span");
      name.textContent = s.name;
      name.style.color = COLORS[i % COLORS.length];
      const v = s.values[j];
      const val = document.createElement("span");
      val.textContent = v === null || v === undefined ? "–" : fmt(v) + (unit || "");
      row.append(name, val);
      return row;
    });
    tip.replaceChildren(head, ...rows);
    tip.hidden = false;
    const fx = ev.clientX - fig.getBoundingClientRect().left;
    tip.style.left = (fx + 12 + tip.offsetWidth > fig.clientWidth ? fx - 12 - tip.offsetWidth : fx + 12) + "px";
    tip.style.top = (ev.clientY - fig.getBoundingClientRect().top + 12) + "px";
  });
  overlay.addEventListener("mouseleave", () => {
    if (pointer && pointer.title === title) pointer = null;
    tip.hidden = true;
    cursor.setAttribute("visibility", "hidden");
  });
  if (pointer && pointer.title === title) {
    const { clientX, clientY } = pointer;
    // Once the redrawn figure is in the page (the caller puts it there).
    requestAnimationFrame(() => {
      if (fig.isConnected) overlay.dispatchEvent(new MouseEvent("mousemove", { clientX, clientY, bubbles: true }));
    });
  }
}

function fmt(v) {
  if (v >= 100) return v.toFixed(0);
  if (v >= 10) return v.toFixed(1);
  return v.toFixed(2);
}

// barChart returns a figure of grouped bars, one group per label (e.g. a
// day "2026-12-01") and one bar per series in it; hovering a group shows
// its values.
export function barChart(title, labels, series, unit) {
  const { fig, svg } = chartFrame(title, { "data-bars": labels.length });
  let max = 0;
  for (const s of series) for (const v of s.values) if (v > max) max = v;
  if (max <= 0) max = 1;
  const slot = (W - L - R) / Math.max(1, labels.length);
  const bw = Math.min(24, Math.max(1, (slot * 0.8) / Math.max(1, series.length)));
  const y = (v) => T + (H - T - B) * (1 - v / max);
  svg.append(el("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
  svg.append(el("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
  svg.append(el("text", { x: L - 4, y: T + 8, "text-anchor": "end", class: "tick" }, fmt(max) + (unit || "")));
  svg.append(el("text", { x: L - 4, y: H - B, "text-anchor": "end", class: "tick" }, "0"));
  if (labels.length) {
    svg.append(el("text", { x: L, y: H - 4, class: "tick" }, labels[0]));
    if (labels.length > 1) svg.append(el("text", { x: W - R, y: H - 4, "text-anchor": "end", class: "tick" }, labels[labels.length - 1]));
  } else {
    svg.append(el("text", { x: (W + L) / 2, y: H / 2, "text-anchor": "middle", class: "tick" }, "no requests in this range"));
  }
  const tip = document.createElement("div");
  tip.className = "tooltip";
  tip.hidden = true;
  labels.forEach((label, j) => {
    const x0 = L + j * slot + slot * 0.1;
    series.forEach((s, i) => {
      const v = s.values[j] || 0;
      const bar = el("rect", { x: (x0 + i * bw).toFixed(1), y: y(v).toFixed(1), width: bw.toFixed(1), height: (H - B - y(v)).toFixed(1),
        fill: COLORS[i % COLORS.length], class: "bar", "data-label": label, "data-series": s.name, "data-value": v });
      bar.addEventListener("mousemove", (ev) => {
        const head = document.createElement("strong");
        head.textContent = label;
        tip.replaceChildren(head, ...series.map((t, k) => {
          const row = document.createElement("div");
          row.style.color = COLORS[k % COLORS.length];
          row.textContent = `${t.name} ${fmt(t.values[j] || 0)}${unit || ""}`;
          return row;
        }));
        tip.hidden = false;
        const box = fig.getBoundingClientRect();
        tip.style.left = ev.clientX - box.left + 12 + "px";
        tip.style.top = ev.clientY - box.top + 12 + "px";
      });
      bar.addEventListener("mouseleave", () => { tip.hidden = true; });
      svg.append(bar);
    });
  });
  fig.append(svg, tip);
  const legend = document.createElement("div");
  legend.className = "legend";
  series.forEach((s, i) => {
    const item = document.createElement("span");
    item.style.color = COLORS[i % COLORS.length];
    item.textContent = `${s.name} ${fmt(s.values.reduce((a, v) => a + (v || 0), 0))}${unit || ""} in all`;
    legend.append(item);
  });
  fig.append(legend);
  return fig;
}
