/* The HTML report's timelines (loadgen/report/timeline.py builds their data): per level, the session plays' swim lanes
   and, beneath them on the same x axis, the server's series, drawn with uPlot (loadgen/report/static/uplot/). Each
   level's data is a JSON script block of class tl-data naming, in data-target, the element to draw into.
   Text from the results (session ids, agents) reaches the page only as textContent or canvas text. */
(function () {
  "use strict";
  const WAIT = "#e8a33d", STREAM = "#3b6fb6", OUTSIDE = "rgba(0, 0, 0, 0.12)", MARK = "#c03030";
  const PALETTE = ["#3b6fb6", "#e8a33d", "#4c9a5b", "#b6443b", "#7a5bb6", "#3ba3b6", "#b65b9a", "#777777"];
  const LANE_PX = 16, CHART_PX = 170, X_LABEL = "seconds from the window's start";
  const groups = {};  // element id -> the level's uPlot charts (the browser test reads them too)

  function fmt(value, digits) {
    return value == null ? "-" : value.toFixed(digits);
  }

  // The warm-up before the window and the drain after it shaded (under the data), its bounds marked (over it).
  function windowHooks(d) {
    const span = (u, from, to) => {
      const left = Math.max(u.bbox.left, u.valToPos(from, "x", true));
      const right = Math.min(u.bbox.left + u.bbox.width, u.valToPos(to, "x", true));
      if (right > left) u.ctx.fillRect(left, u.bbox.top, right - left, u.bbox.height);
    };
    const mark = (u, at) => {
      const x = Math.round(u.valToPos(at, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
      u.ctx.fillRect(x - 1, u.bbox.top, 2 * devicePixelRatio, u.bbox.height);
    };
    return {
      drawClear: [u => { u.ctx.save(); u.ctx.fillStyle = OUTSIDE; span(u, d.x[0], 0); span(u, d.window_s, d.x[1]);
                         u.ctx.restore(); }],
      draw: [u => { u.ctx.save(); u.ctx.fillStyle = MARK; mark(u, 0); mark(u, d.window_s); u.ctx.restore(); }],
    };
  }

  // Zooming one chart zooms the level's others to the same seconds.
  function zoomOthers(charts, u) {
    const {min, max} = u.scales.x;
    for (const other of charts) {
      if (other !== u && (other.scales.x.min !== min || other.scales.x.max !== max)) other.setScale("x", {min, max});
    }
  }

  function baseOpts(d, root, charts, yAxis, height) {
    const hooks = windowHooks(d);
    hooks.setScale = [(u, key) => { if (key === "x") zoomOthers(charts, u); }];
    return {
      width: root.clientWidth || 900, height,
      scales: {x: {time: false}},
      cursor: {sync: {key: root.id, scales: ["x", null]}, drag: {x: true, y: false}},
      axes: [{label: X_LABEL}, yAxis],
      hooks,
    };
  }

  function laneIndex(d) {
    const byLane = d.lanes.map(() => []);
    d.bars.lane.forEach((lane, i) => byLane[lane].push(i));
    return byLane;
  }

  function drawBars(u, d) {
    const b = d.bars, ctx = u.ctx, {min, max} = u.scales.x;
    const pitch = Math.abs(u.valToPos(0, "y", true) - u.valToPos(-1, "y", true));
    const h = Math.min(12, Math.max(2, pitch * 0.7));
    ctx.save();
    ctx.beginPath();
    ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
    ctx.clip();
    ctx.fillStyle = "#ddd";  // a rule above each play's parent lane
    d.lanes.forEach((lane, i) => {
      if (i && !lane.agent) ctx.fillRect(u.bbox.left, u.valToPos(-i + 0.5, "y", true), u.bbox.width, 1);
    });
    let drawn = 0;
    for (let i = 0; i < b.lane.length; i++) {
      const start = b.start[i] / 1e3, first = start + b.ttft[i] / 1e3, end = start + b.e2el[i] / 1e3;
      if (end < min || start > max) continue;
      const x0 = u.valToPos(start, "x", true), x1 = u.valToPos(first, "x", true);
      const x2 = u.valToPos(end, "x", true), y = u.valToPos(-b.lane[i], "y", true) - h / 2;
      ctx.fillStyle = WAIT;
      ctx.fillRect(x0, y, Math.max(1, x1 - x0), h);
      ctx.fillStyle = STREAM;
      ctx.fillRect(x1, y, Math.max(1, x2 - x1), h);
      drawn++;
    }
    ctx.restore();
    u.root.dataset.bars = String(drawn);
  }

  function describe(d, i) {
    const b = d.bars, lane = d.lanes[b.lane[i]];
    return [`session ${lane.session} (play ${lane.play})` + (lane.agent ? `, subagent ${lane.agent}` : ""),
            `turn ${b.turn[i]}: ISL ${b.isl[i]}, OSL ${b.osl[i]}`,
            `start ${fmt(b.start[i] / 1e3, 3)} s, TTFT ${fmt(b.ttft[i], 1)} ms, E2EL ${fmt(b.e2el[i] / 1e3, 3)} s`
           ].join("\n");
  }

  // The bar under the pointer (within 3 px), or -1.
  function barAt(u, d, byLane, left, top) {
    const lane = Math.round(-u.posToVal(top, "y"));
    if (left == null || left < 0 || lane < 0 || lane >= byLane.length) return -1;
    const t = u.posToVal(left, "x"), slack = u.posToVal(left + 3, "x") - t;
    return byLane[lane].find(i => {
      const start = d.bars.start[i] / 1e3;
      return start - slack <= t && t <= start + d.bars.e2el[i] / 1e3 + slack;
    }) ?? -1;
  }

  function tooltip(u, d) {
    const tip = document.createElement("div"), byLane = laneIndex(d);
    tip.className = "tl-tip";
    u.over.appendChild(tip);
    let inside = false;  // synced cursors move this chart's too: only the pointer's own chart shows a tip
    u.over.addEventListener("mouseenter", () => { inside = true; });
    u.over.addEventListener("mouseleave", () => { inside = false; tip.style.display = "none"; });
    return u => {
      const {left, top} = u.cursor, hit = inside ? barAt(u, d, byLane, left, top) : -1;
      tip.style.display = hit < 0 ? "none" : "block";
      if (hit < 0) return;
      tip.textContent = describe(d, hit);
      tip.style.left = Math.min(left + 12, u.over.clientWidth - tip.offsetWidth) + "px";
      tip.style.top = (top + 14) + "px";
    };
  }

  function lanesChart(d, root, charts, axisPx) {
    const n = d.lanes.length;
    const yAxis = {
      label: "session", size: axisPx, gap: 4, grid: {show: false}, ticks: {show: false},
      splits: () => d.lanes.map((_, i) => -i), values: (u, splits) => splits.map(s => d.lanes[-s].label),
    };
    const opts = baseOpts(d, root, charts, yAxis, Math.max(n, 5) * LANE_PX + 90);
    opts.title = "session plays";
    opts.class = "tl-lanes";
    opts.legend = {show: false};
    opts.cursor.y = false;
    opts.cursor.points = {show: false};
    opts.scales.y = {range: [-(n - 0.5), 0.5]};
    opts.series = [{}, {scale: "y", paths: () => null, points: {show: false}}];
    opts.hooks.draw.push(u => drawBars(u, d));
    const u = new uPlot(opts, [d.x, [null, null]], root);
    u.hooks.setCursor = [tooltip(u, d)];
    return u;
  }

  // A line chart of the chart's series; the x range's ends are added with no readings, so every chart of
  // the level spans the same seconds.
  function seriesChart(d, c, root, charts, axisPx) {
    const opts = baseOpts(d, root, charts, {label: c.unit, size: axisPx}, CHART_PX);
    opts.title = c.title;
    opts.class = "tl-series";
    opts.scales.y = {range: [0, null]};
    opts.series = [{label: "seconds", value: (u, v) => fmt(v, 2)},
                   ...c.lines.map((line, i) => ({label: line.label, stroke: PALETTE[i % PALETTE.length], width: 1.5,
                                                 value: (u, v) => fmt(v, 1)}))];
    const data = [[d.x[0], ...c.t_s, d.x[1]], ...c.lines.map(line => [null, ...line.values, null])];
    return new uPlot(opts, data, root);
  }

  function draw(d, root) {
    const longest = Math.max(4, ...d.lanes.map(lane => lane.label.length));
    // one axis width (and a label beside each axis) for every chart: their x axes line up
    const axisPx = Math.min(220, 16 + 7 * longest);
    const charts = [];
    charts.push(lanesChart(d, root, charts, axisPx));
    for (const c of d.charts) charts.push(seriesChart(d, c, root, charts, axisPx));
    groups[root.id] = charts;
    root.dataset.drawn = String(charts.length);
  }

  function drawAll() {
    for (const block of document.querySelectorAll("script.tl-data")) {
      draw(JSON.parse(block.textContent), document.getElementById(block.dataset.target));
    }
    window.addEventListener("resize", () => {
      for (const [id, charts] of Object.entries(groups)) {
        const width = document.getElementById(id).clientWidth;
        for (const u of charts) u.setSize({width, height: u.height});
      }
    });
  }

  window.agentloadTimelines = groups;
  drawAll();
})();
