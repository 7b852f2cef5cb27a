// aioprof's HTML report: draws the embedded data (aioprof/report/html.py). Plain DOM,
// SVG and canvas; every text from the data goes through textContent, never as markup.
"use strict";
(function () {
var D = JSON.parse(document.getElementById("aioprof-data").textContent);
var errors = [];
function $(id) { return document.getElementById(id); }
function el(tag, attrs, text) {
  var e = document.createElement(tag);
  for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function svg(tag, attrs) {
  var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
  return e;
}
function ms(v) { return v === null || v === undefined ? "-" : (v * 1e3).toFixed(1); }
function int(v) { return v === null || v === undefined ? "-" : String(Math.trunc(v)); }
function fmtUs(us) { return (us / 1e3).toFixed(1) + " ms"; }
function plural(n, w) { return n + " " + w + (n === 1 ? "" : "s"); }
function guard(name, f) {
  try { f(); } catch (e) { errors.push(name + ": " + e); var p = el("p", {"class": "missing"}, name + ": " + e); document.body.appendChild(p); }
}
var showInternal = false;

// -- header and loops ---------------------------------------------------------------
guard("header", function () { $("head").textContent = D.header.join("\n"); });
guard("loops", function () {
  var box = $("loop-cards");
  D.loops.cards.forEach(function (c) {
    box.appendChild(el("div", {"class": "loopname"}, c.name));
    var row = el("div", {"class": "cards"});
    c.figures.forEach(function (f) {
      var card = el("div", {"class": "card"}, f[0]);
      card.appendChild(el("b", {}, f[1]));
      row.appendChild(card);
    });
    box.appendChild(row);
  });
  (D.loops.charts || []).forEach(function (c) {
    // busy share of each span of the run, from the trace's ticks less their select waits
    var W = 720, H = 60, n = c.busy_us.length, g = svg("svg", {width: W + 40, height: H + 16, id: "busy-chart-" + c.loop});
    g.appendChild(svg("rect", {x: 40, y: 0, width: W, height: H, fill: "#f7f7f7"}));
    c.busy_us.forEach(function (v, i) {
      var f = Math.min(1, v / c.bin_us), h = f * H;
      var r = svg("rect", {x: (40 + i * W / n).toFixed(1), y: (H - h).toFixed(1), width: (W / n).toFixed(1), height: h.toFixed(1), fill: "#3a7bd5"});
      var t = svg("title"); t.textContent = (i * c.bin_us / 1e3).toFixed(1) + " ms: busy " + (100 * f).toFixed(1) + "%"; r.appendChild(t);
      g.appendChild(r);
    });
    [["100%", 10], ["0%", H]].forEach(function (l) { var t = svg("text", {x: 0, y: l[1], "font-size": 10}); t.textContent = l[0]; g.appendChild(t); });
    var end = svg("text", {x: W - 20, y: H + 12, "font-size": 10}); end.textContent = (n * c.bin_us / 1e3).toFixed(0) + " ms"; g.appendChild(end);
    box.appendChild(el("div", {"class": "note"}, "loop " + c.loop + ": busy share over time (ticks less select waits, from the trace), " + n + " spans of " + (c.bin_us / 1e3).toFixed(1) + " ms"));
    box.appendChild(g);
  });
  $("loops").textContent = D.loops.lines.length ? D.loops.lines.join("\n") : "No event loop figures in this report.";
});

// -- tables -------------------------------------------------------------------------
var SORT_NAMES = {busy: "busy ms", sched: "sched ms", scheduled: "sched ms", idle: "idle ms",
                  cpu: "cpu ms", steps: "steps", max: "max ms"};
var tables = {};
function Table(id, cols, data, internalAt, what) {
  this.id = id; this.cols = cols; this.data = data; this.internalAt = internalAt; this.what = what;
  this.sortCol = cols.findIndex(function (c) { return c[0] === "busy ms"; });
  this.desc = true;
  var t = $(id), self = this;
  var tr = el("tr");
  cols.forEach(function (c, i) {
    var th = el("th", {"class": c[2] === "s" ? "" : "num", "data-col": c[0]}, c[0]);
    th.addEventListener("click", function () { self.sortBy(i); });
    tr.appendChild(th);
  });
  var thead = el("thead"); thead.appendChild(tr); t.appendChild(thead);
  this.tbody = el("tbody"); t.appendChild(this.tbody);
  this.draw();
}
Table.prototype.sortBy = function (i) {
  if (this.sortCol === i) this.desc = !this.desc;
  else { this.sortCol = i; this.desc = this.cols[i][2] !== "s"; }
  this.draw();
};
Table.prototype.draw = function () {
  var cols = this.cols, at = cols[this.sortCol] ? cols[this.sortCol][1] : 0, desc = this.desc;
  var str = cols[this.sortCol] && cols[this.sortCol][2] === "s", self = this;
  var rows = this.data.rows.filter(function (r) { return showInternal || !r[self.internalAt]; });
  rows.sort(function (a, b) {
    var x = a[at], y = b[at];
    if (x === null || x === undefined) return (y === null || y === undefined) ? 0 : 1;
    if (y === null || y === undefined) return -1;
    var c = str ? String(x).localeCompare(String(y)) : x - y;
    return desc ? -c : c;
  });
  var body = el("tbody");
  rows.forEach(function (r) {
    var tr = el("tr");
    cols.forEach(function (c) {
      var v = r[c[1]];
      tr.appendChild(el("td", c[2] === "s" ? {} : {"class": "num"},
                        c[2] === "ms" ? ms(v) : c[2] === "int" ? int(v) : (v === null ? "-" : String(v))));
    });
    body.appendChild(tr);
  });
  this.tbody.replaceWith(body); this.tbody = body;
  var ths = $(this.id).querySelectorAll("th");
  for (var i = 0; i < ths.length; i++) {
    ths[i].className = (cols[i][2] === "s" ? "" : "num") + (i === this.sortCol ? " sorted" : "");
    ths[i].textContent = cols[i][0] + (i === this.sortCol ? (desc ? " \u25bc" : " \u25b2") : "");
  }
  $(this.id).setAttribute("data-sorted", cols[this.sortCol][0] + (desc ? " desc" : " asc"));
  var total = this.data.total, kept = this.data.rows.length;
  var hidden = this.data.rows.length - this.data.rows.filter(function (r) { return !r[self.internalAt]; }).length;
  var notes = [plural(rows.length, "row") + " shown, sorted by " + cols[this.sortCol][0] + (desc ? " (descending)" : " (ascending)") + "; click a header to sort"];
  if (kept < total) notes.push("kept " + kept + " of " + total + " " + this.what + ": the top " + D.keep_rows + " by each time and count column (the rest left out to bound the file)");
  if (hidden && !showInternal) notes.push(hidden + " internal hidden (show asyncio's internal rows)");
  if (this.data.dropped) notes.push(this.data.dropped + " more tasks not recorded past max_tasks; the coroutine table counts them");
  $(this.id + "-note").textContent = notes.join("; ");
};
guard("coroutines", function () {
  tables.coroutines = new Table("coroutines", [["coroutine", 0, "s"], ["tasks", 1, "int"], ["steps", 2, "int"],
    ["busy ms", 3, "ms"], ["sched ms", 4, "ms"], ["idle ms", 5, "ms"], ["cpu ms", 6, "ms"],
    ["max ms", 7, "ms"], ["p99 ms", 8, "ms"], ["defined at", 9, "s"]], D.coroutines, 10, "coroutines");
});
guard("tasks", function () {
  tables.tasks = new Table("tasks", [["id", 0, "int"], ["name", 1, "s"], ["coroutine", 2, "s"],
    ["created at", 3, "s"], ["parent", 4, "int"], ["state", 5, "s"], ["steps", 6, "int"],
    ["busy ms", 7, "ms"], ["sched ms", 8, "ms"], ["idle ms", 9, "ms"], ["cpu ms", 10, "ms"],
    ["max ms", 11, "ms"], ["await site", 12, "s"]], D.tasks, 13, "tasks");
});
$("internal").addEventListener("change", function (e) {
  showInternal = e.target.checked;
  for (var k in tables) tables[k].draw();
});

// -- flame graphs (icicle) ------------------------------------------------------------
var flames = {};
function hue(s) { var h = 0; for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0; return h; }
function Flame(id, f, unit) {
  var box = $(id), self = this;
  this.id = id; this.box = box;
  if (f.missing) { box.appendChild(el("p", {"class": "missing"}, "Not recorded: " + f.missing + ".")); return; }
  var root = {f: -1, v: 0, self: 0, n: 0, kids: {}, parent: null, depth: 0};
  f.stacks.forEach(function (s) {
    var node = root; root.v += s[1]; root.n += s[2];
    s[0].forEach(function (fi) {
      var k = node.kids[fi];
      if (!k) k = node.kids[fi] = {f: fi, v: 0, self: 0, n: 0, kids: {}, parent: node, depth: node.depth + 1};
      k.v += s[1]; k.n += s[2]; node = k;
    });
    node.self += s[1];
  });
  this.root = root; this.zoom = root; this.unit = unit;
  var about = [fmtUs(root.v) + " in " + plural(f.stacks.length, "stack")];
  if (f.about && f.about[0] !== null) about.push(f.about[0] + " samples" + (f.about[1] ? ", asked every " + ms(f.about[1]) + " ms" : ""));
  if (f.other) about.push(f.other[0] + " lighter stacks (" + fmtUs(f.other[1]) + ") left out to bound the file");
  box.appendChild(el("p", {"class": "note"}, about.join("; ") + ". " + unit + " Click a frame to zoom in, the top bar to zoom out."));
  var bar = el("div", {"class": "bar"});
  this.search = el("input", {type: "search", placeholder: "search frames (function, file)", id: id + "-search"});
  this.search.addEventListener("input", function () { self.draw(); });
  bar.appendChild(this.search);
  this.found = el("span", {"class": "note", id: id + "-found"});
  bar.appendChild(this.found);
  var reset = el("button", {}, "reset zoom");
  reset.addEventListener("click", function () { self.select(self.root); });
  bar.appendChild(reset);
  box.appendChild(bar);
  this.detail = el("div", {"class": "detail", id: id + "-detail"}, "Click a frame for its file:line and figures.");
  box.appendChild(this.detail);
  this.svgBox = el("div"); box.appendChild(this.svgBox);
  this.draw();
}
Flame.prototype.label = function (n) { return n.f < 0 ? "all" : n.f < D.frames.length ? D.frames[n.f][0] : "[unknown]"; };
Flame.prototype.loc = function (n) { return n.f >= 0 && n.f < D.frames.length ? D.frames[n.f][1] : ""; };
Flame.prototype.select = function (n) {
  this.zoom = n;
  var parts = [this.label(n)];
  if (this.loc(n)) parts.push(this.loc(n));
  var total = this.root.v || 1;
  parts.push("total " + fmtUs(n.v) + " (" + (100 * n.v / total).toFixed(1) + "%)", "self " + fmtUs(n.self),
             (this.id === "cpu" ? "samples " : "suspensions ") + n.n);
  this.detail.textContent = parts.join("  \u00b7  ");
  this.detail.setAttribute("data-frame", this.label(n));
  var path = [], p = n;
  while (p && p.parent) { path.unshift(this.label(p)); p = p.parent; }
  this.detail.setAttribute("data-path", path.join(";"));
  this.detail.setAttribute("data-total-us", String(n.v));
  this.draw();
};
Flame.prototype.draw = function () {
  var self = this, W = Math.max(600, Math.min(1400, (this.box.clientWidth || 1100) - 2)), H = 16;
  var q = (this.search.value || "").toLowerCase(), matched = 0, nmatch = 0;
  var g = svg("svg", {width: W, height: H, "font-size": 11});
  var maxDepth = 0, zoom = this.zoom;
  function frame(n, x, w, depth) {
    var label = self.label(n), m = q && (label.toLowerCase().indexOf(q) >= 0 || self.loc(n).toLowerCase().indexOf(q) >= 0);
    var r = svg("rect", {x: x.toFixed(1), y: depth * H, width: Math.max(0.5, w).toFixed(1), height: H - 1,
                         fill: label.charAt(0) === "[" ? "hsl(205,55%," + (70 + hue(label) % 15) + "%)" : "hsl(" + (15 + hue(label) % 40) + ",80%," + (58 + hue(label) % 17) + "%)"});
    if (m) r.setAttribute("class", "match");
    var title = svg("title"); title.textContent = label + (self.loc(n) ? " " + self.loc(n) : "") + " \u2014 " + fmtUs(n.v);
    r.appendChild(title);
    r.addEventListener("click", function () { self.select(n === self.zoom && n.parent ? n.parent : n); });
    g.appendChild(r);
    if (w > 30) {
      var t = svg("text", {x: (x + 3).toFixed(1), y: depth * H + 12});
      var chars = Math.floor((w - 6) / 6.6);
      t.textContent = label.length > chars ? label.slice(0, Math.max(0, chars - 1)) + "\u2026" : label;
      g.appendChild(t);
    }
    if (depth > maxDepth) maxDepth = depth;
    return m;
  }
  // the path from the root to the zoomed frame, full width
  var path = [], n = zoom;
  while (n) { path.unshift(n); n = n.parent; }
  path.forEach(function (p, i) { if (frame(p, 0, W, i) && (!matched)) { matched = p.v; nmatch++; } });
  var base = path.length - 1, scale = zoom.v ? W / zoom.v : 0;
  function walk(node, x, depth, inMatch) {
    var keys = Object.keys(node.kids).sort(function (a, b) { return node.kids[b].v - node.kids[a].v; });
    keys.forEach(function (k) {
      var c = node.kids[k], w = c.v * scale;
      if (w >= 0.5) {
        var m = frame(c, x, w, depth);
        if (m) { nmatch++; if (!inMatch) matched += c.v; }
        walk(c, x, depth + 1, inMatch || m);
      }
      x += w;
    });
  }
  walk(zoom, 0, base + 1, !!matched);
  g.setAttribute("height", (maxDepth + 1) * H);
  this.svgBox.replaceChildren(g);
  this.found.textContent = q ? "  " + nmatch + " frames match: " + fmtUs(matched) + " (" + (100 * matched / (this.root.v || 1)).toFixed(1) + "%)  " : "  ";
};
guard("cpu flame", function () { flames.cpu = new Flame("cpu", D.flames.cpu, "Sampled on-loop time, at the line that ran."); });
guard("await flame", function () { flames.idle = new Flame("idle", D.flames.idle, "Await time in task time: every suspended task's wait added up (it can exceed the wall time)."); });

// -- timeline -------------------------------------------------------------------------
var COLORS = ["#3a7bd5", "#f0a030", "#cfd8dc", "#8bc34a", "#d0d0d0", "#e53935", "#9c6ade"];
var KINDS = ["running", "scheduled", "awaiting", "tick", "select wait", "slow step", "callback"];
guard("timeline", function () {
  var T = D.timeline, box = $("timeline");
  if (T.missing) { box.appendChild(el("p", {"class": "missing"}, "Not recorded: " + T.missing + ".")); return; }
  var notes = [plural(T.lanes.length, "lane")];
  if (T.left.lanes) notes.push(T.left.lanes + " task lanes left out (the tasks that ran least)");
  if (T.left.short) notes.push(T.left.short + " short intervals left out (the longest kept)");
  if (T.dropped) notes.push("the trace ring dropped " + T.dropped + " older events");
  box.appendChild(el("p", {"class": "note"}, notes.join("; ") + ". Wheel or +/\u2212 to zoom, drag to pan, click an interval for its figures."));
  var legend = el("div", {"class": "legend"});
  KINDS.forEach(function (k, i) { var s = el("span"); s.style.background = COLORS[i]; legend.appendChild(s); legend.appendChild(document.createTextNode(k)); });
  box.appendChild(legend);
  var bar = el("div", {"class": "bar"}), detail = el("div", {"class": "detail", id: "timeline-detail"}, "");
  var end = T.wall_us;
  T.lanes.forEach(function (l) { l[2].forEach(function (e) { if (e[1] + e[2] > end) end = e[1] + e[2]; }); });
  var view = [0, Math.max(1, end)];
  var LABEL = 220, LH = 14, W = Math.max(700, Math.min(1400, (box.clientWidth || 1100) - 2));
  var canvas = el("canvas", {id: "timeline-canvas"});
  var dpr = window.devicePixelRatio || 1;
  canvas.width = W * dpr; canvas.height = (T.lanes.length * LH + 20) * dpr;
  canvas.style.width = W + "px"; canvas.style.height = (T.lanes.length * LH + 20) + "px";
  function zoomBy(f, at) {
    var span = view[1] - view[0], c = at === undefined ? view[0] + span / 2 : at;
    var s = Math.max(10, span * f);
    view = [c - (c - view[0]) * s / span, c + (view[1] - c) * s / span];
    if (view[0] < 0) { view[1] -= view[0]; view[0] = 0; }
    draw();
  }
  [["+", 0.5], ["\u2212", 2]].forEach(function (b) {
    var btn = el("button", {}, b[0]); btn.addEventListener("click", function () { zoomBy(b[1]); }); bar.appendChild(btn);
  });
  var reset = el("button", {}, "reset"); reset.addEventListener("click", function () { view = [0, Math.max(1, end)]; draw(); });
  bar.appendChild(reset);
  var range = el("span", {"class": "note", id: "timeline-range"}); bar.appendChild(range);
  box.appendChild(bar); box.appendChild(detail); box.appendChild(canvas);
  function x(t) { return LABEL + (t - view[0]) * (W - LABEL) / (view[1] - view[0]); }
  function draw() {
    var ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, W, canvas.height);
    ctx.font = "11px monospace"; ctx.textBaseline = "middle";
    T.lanes.forEach(function (l, i) {
      var y = 20 + i * LH;
      ctx.fillStyle = i % 2 ? "#fafafa" : "#fff"; ctx.fillRect(0, y, W, LH);
      ctx.save(); ctx.beginPath(); ctx.rect(LABEL, y, W - LABEL, LH); ctx.clip();
      var order = l[1] ? [3, 4, 6, 5] : [2, 1, 0];
      order.forEach(function (k) {
        ctx.fillStyle = COLORS[k];
        l[2].forEach(function (e) {
          if (e[0] !== k || e[1] > view[1] || e[1] + e[2] < view[0]) return;
          var x0 = x(e[1]), w = Math.max(1, x(e[1] + e[2]) - x0);
          var top = k === 4 ? y + 4 : k === 6 ? y + 7 : y + 1, h = k === 4 ? LH - 6 : k === 6 ? LH - 8 : LH - 2;
          ctx.fillRect(x0, top, w, h);
        });
      });
      ctx.restore();
      ctx.fillStyle = l[1] ? "#000" : "#333";
      ctx.fillText(l[0].length > 32 ? l[0].slice(0, 31) + "\u2026" : l[0], 2, y + LH / 2, LABEL - 4);
    });
    ctx.fillStyle = "#555";
    for (var i = 0; i <= 5; i++) {
      var t = view[0] + (view[1] - view[0]) * i / 5;
      ctx.fillText((t / 1e3).toFixed(1) + " ms", Math.min(W - 60, x(t)), 8);
    }
    range.textContent = "  " + (view[0] / 1e3).toFixed(1) + " \u2013 " + (view[1] / 1e3).toFixed(1) + " ms";
  }
  canvas.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var r = canvas.getBoundingClientRect(), px = ev.clientX - r.left;
    if (px < LABEL) return;
    zoomBy(ev.deltaY < 0 ? 0.8 : 1.25, view[0] + (px - LABEL) * (view[1] - view[0]) / (W - LABEL));
  }, {passive: false});
  var drag = null;
  canvas.addEventListener("mousedown", function (ev) { drag = [ev.clientX, view[0], view[1], false]; });
  window.addEventListener("mouseup", function () { setTimeout(function () { drag = null; }, 0); });
  canvas.addEventListener("mousemove", function (ev) {
    if (!drag) return;
    var dt = (ev.clientX - drag[0]) * (drag[2] - drag[1]) / (W - LABEL);
    if (Math.abs(ev.clientX - drag[0]) > 2) drag[3] = true;
    var a = Math.max(0, drag[1] - dt); view = [a, a + drag[2] - drag[1]]; draw();
  });
  canvas.addEventListener("click", function (ev) {
    if (drag && drag[3]) return;
    var r = canvas.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
    var lane = T.lanes[Math.floor((py - 20) / LH)];
    if (!lane || px < LABEL) return;
    var t = view[0] + (px - LABEL) * (view[1] - view[0]) / (W - LABEL), slack = 2 * (view[1] - view[0]) / (W - LABEL);
    var hit = null;
    lane[2].forEach(function (e) { if (e[1] - slack <= t && t <= e[1] + e[2] + slack && (!hit || e[0] === 5 || e[2] < hit[2])) hit = e; });
    detail.textContent = hit ? lane[0] + ": " + T.strings[hit[3]] + ", from " + fmtUs(hit[1]) + " for " + (hit[2] / 1e3).toFixed(3) + " ms" : lane[0];
  });
  draw();
});

// -- what the URL asks: #sort=idle, #frame=TEXT (a click on the first cpu frame that matches)
guard("fragment", function () {
  var args = {};
  location.hash.slice(1).split("&").forEach(function (kv) {
    var i = kv.indexOf("="); if (i > 0) args[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1));
  });
  if (args.sort) {
    var name = SORT_NAMES[args.sort] || args.sort;
    ["coroutines", "tasks"].forEach(function (id) {
      var th = $(id).querySelector('th[data-col="' + name.replace(/"/g, "") + '"]');
      if (th) th.dispatchEvent(new MouseEvent("click", {bubbles: true}));   // the header's own click
    });
  }
  if (args.internal === "1") { $("internal").checked = true; $("internal").dispatchEvent(new Event("change")); }
  if (args.frame) {
    ["cpu", "idle"].forEach(function (id) {
      if (!flames[id] || !flames[id].root) return;
      var rects = $(id).querySelectorAll("rect"), q = args.frame.toLowerCase();
      for (var i = 0; i < rects.length; i++) {
        var t = rects[i].querySelector("title");
        if (t && t.textContent.toLowerCase().indexOf(q) >= 0) { rects[i].dispatchEvent(new MouseEvent("click", {bubbles: true})); break; }
      }
    });
  }
});
function done() {
  document.body.setAttribute("data-resources", String(performance.getEntriesByType("resource").length));
  document.body.setAttribute("data-errors", String(errors.length));
  document.body.setAttribute("data-ready", "1");
}
done();
window.addEventListener("load", done);
})();
