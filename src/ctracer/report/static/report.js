/* ctracer report: table filters, sorting and the "only changed rows" switch. No network. */
(function () {
  "use strict";

  function rowsOf(table) {
    return table.tBodies.length ? Array.prototype.slice.call(table.tBodies[0].rows) : [];
  }

  document.querySelectorAll("input[data-filter]").forEach(function (input) {
    var table = document.getElementById(input.getAttribute("data-filter"));
    if (!table) { return; }
    input.addEventListener("input", function () {
      var query = input.value.trim().toLowerCase();
      rowsOf(table).forEach(function (tr) {
        tr.hidden = query !== "" && tr.textContent.toLowerCase().indexOf(query) < 0;
      });
    });
  });

  document.querySelectorAll("input[data-only-changed]").forEach(function (box) {
    var table = document.getElementById(box.getAttribute("data-only-changed"));
    if (!table) { return; }
    box.addEventListener("change", function () {
      table.classList.toggle("only-changed", box.checked);
    });
  });

  function sortKey(cell) {
    var text = cell ? cell.textContent.trim() : "";
    var number = parseFloat(text.replace(/[^0-9.eE+-]/g, ""));
    var unit = /([nµm]?s)$/.exec(text);
    if (unit && !isNaN(number)) {
      number *= { ns: 1, "µs": 1e3, ms: 1e6, s: 1e9 }[unit[1]];
    }
    return /^-?[0-9.]/.test(text) && !/^0x/i.test(text) && !isNaN(number)
      ? { n: number, t: text } : { n: null, t: text.toLowerCase() };
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(headers, function (th, column) {
      th.addEventListener("click", function () {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(headers, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var rows = rowsOf(table);
        var keyed = rows.map(function (tr, i) { return { tr: tr, k: sortKey(tr.cells[column]), i: i }; });
        keyed.sort(function (a, b) {
          var c;
          if (a.k.n !== null && b.k.n !== null) { c = a.k.n - b.k.n; }
          else { c = a.k.t < b.k.t ? -1 : a.k.t > b.k.t ? 1 : 0; }
          return (ascending ? c : -c) || a.i - b.i;
        });
        var body = table.tBodies[0];
        keyed.forEach(function (x) { body.appendChild(x.tr); });
      });
    });
  });
}());

/* Timeline: search, filters by function / thread / field changed, a time brush, and a
   panel with every field's value at the clicked row.  Row data come from the page
   itself (cells, data-* attributes and the JSON island #page-state); no network. */
(function () {
  "use strict";
  var table = document.getElementById("timeline");
  if (!table || !table.tBodies.length) { return; }
  var rows = Array.prototype.slice.call(table.tBodies[0].rows).filter(function (tr) {
    return tr.id;
  });
  var withObject = table.classList.contains("with-object");
  var callCell = withObject ? 3 : 2;

  function info(tr) {
    if (!tr._info) {
      var fields = [];
      tr.querySelectorAll(".chg b").forEach(function (b) { fields.push(b.textContent); });
      var cell = tr.cells[callCell];
      var fn = cell ? cell.textContent.replace(/^[\s→←⋯]+/, "").split(/\s{2,}| no (entry|exit) seen| unreadable| in /)[0].trim() : "";
      tr._info = {
        time: parseFloat(tr.cells[0].textContent),
        thread: tr.cells[1].textContent.trim(),
        fn: tr.getAttribute("data-fn") || fn,
        fields: fields,
        text: tr.textContent.toLowerCase()
      };
    }
    return tr._info;
  }

  function options(select, values) {
    if (!select) { return; }
    values.sort().forEach(function (v) {
      var o = document.createElement("option");
      o.value = v; o.textContent = v;
      select.appendChild(o);
    });
  }
  var fnSet = {}, threadSet = {}, fieldSet = {};
  rows.forEach(function (tr) {
    var i = info(tr);
    fnSet[i.fn] = 1; threadSet[i.thread] = 1;
    i.fields.forEach(function (f) { fieldSet[f] = 1; });
  });
  var q = function (name) { return document.querySelector("[data-timeline='" + name + "']"); };
  var search = q("search"), fnSel = q("function"), threadSel = q("thread"), fieldSel = q("field");
  var fromBox = q("from"), toBox = q("to"), shown = q("shown");
  options(fnSel, Object.keys(fnSet));
  options(threadSel, Object.keys(threadSet));
  options(fieldSel, Object.keys(fieldSet));

  function apply() {
    var text = search ? search.value.trim().toLowerCase() : "";
    var fn = fnSel ? fnSel.value : "", th = threadSel ? threadSel.value : "";
    var field = fieldSel ? fieldSel.value : "";
    var lo = fromBox && fromBox.value !== "" ? parseFloat(fromBox.value) : -Infinity;
    var hi = toBox && toBox.value !== "" ? parseFloat(toBox.value) : Infinity;
    var count = 0;
    rows.forEach(function (tr) {
      var i = info(tr);
      var ok = (!text || i.text.indexOf(text) >= 0) && (!fn || i.fn === fn) &&
        (!th || i.thread === th) && (!field || i.fields.indexOf(field) >= 0) &&
        i.time >= lo && i.time <= hi;
      tr.hidden = !ok;
      if (ok) { count += 1; }
    });
    if (shown) { shown.textContent = count + " of " + rows.length + " rows shown"; }
  }
  [search, fnSel, threadSel, fieldSel, fromBox, toBox].forEach(function (el) {
    if (el) { el.addEventListener("input", apply); el.addEventListener("change", apply); }
  });

  // the function named in the address (#fn=NAME, from a call-graph node) filters at once
  function fromHash() {
    var m = /^#fn=(.+)$/.exec(window.location.hash);
    if (m && fnSel) { fnSel.value = decodeURIComponent(m[1]); apply(); }
  }
  window.addEventListener("hashchange", fromHash);
  fromHash();

  // time brush: drag across the strip to keep only the rows in that time window
  var brush = document.getElementById("time-brush");
  if (brush && rows.length) {
    var t0 = info(rows[0]).time, t1 = info(rows[rows.length - 1]).time;
    var span = Math.max(t1 - t0, 1e-9), bins = 120, counts = [], changed = [], k;
    for (k = 0; k < bins; k += 1) { counts.push(0); changed.push(0); }
    rows.forEach(function (tr) {
      var b = Math.min(bins - 1, Math.floor((info(tr).time - t0) / span * bins));
      counts[b] += 1;
      if (tr.classList.contains("changed")) { changed[b] += 1; }
    });
    var most = Math.max.apply(null, counts) || 1, ns = "http://www.w3.org/2000/svg";
    counts.forEach(function (c, b) {
      var r = document.createElementNS(ns, "rect");
      var h = 22 * c / most;
      r.setAttribute("x", b * 1000 / bins); r.setAttribute("width", 1000 / bins - 1);
      r.setAttribute("y", 24 - h); r.setAttribute("height", h);
      r.setAttribute("class", changed[b] ? "bar changed" : "bar");
      brush.appendChild(r);
    });
    var sel = document.createElementNS(ns, "rect");
    sel.setAttribute("class", "selection"); sel.setAttribute("y", 0); sel.setAttribute("height", 24);
    sel.setAttribute("width", 0);
    brush.appendChild(sel);
    var start = null;
    function at(ev) {
      var box = brush.getBoundingClientRect();
      return Math.max(0, Math.min(1000, (ev.clientX - box.left) / box.width * 1000));
    }
    brush.addEventListener("mousedown", function (ev) { start = at(ev); ev.preventDefault(); });
    brush.addEventListener("mousemove", function (ev) {
      if (start === null) { return; }
      var x = at(ev);
      sel.setAttribute("x", Math.min(start, x)); sel.setAttribute("width", Math.abs(x - start));
    });
    window.addEventListener("mouseup", function (ev) {
      if (start === null) { return; }
      var x = at(ev), a = Math.min(start, x), b = Math.max(start, x);
      start = null;
      if (b - a < 2) {  // a click: clear the window
        sel.setAttribute("width", 0);
        fromBox.value = ""; toBox.value = "";
      } else {
        fromBox.value = (t0 + a / 1000 * span).toFixed(6);
        toBox.value = (t0 + b / 1000 * span).toFixed(6);
      }
      apply();
    });
  }

  // clicking a row: every field's value at that moment, from the page's starting state
  // (#page-state) and the changes of the rows before it
  var island = document.getElementById("page-state");
  var panel = document.getElementById("row-state");
  if (island && panel) {
    var state = JSON.parse(island.textContent);
    table.tBodies[0].addEventListener("click", function (ev) {
      var tr = ev.target.closest("tr");
      if (!tr || !tr.id || ev.target.closest("a")) { return; }
      var obj = tr.getAttribute("data-o") || "";
      var values = Object.assign({}, state.objects[obj] || {});
      var changedHere = {};
      for (var n = 0; n < rows.length; n += 1) {
        var r = rows[n];
        if ((r.getAttribute("data-o") || "") === obj) {
          r.querySelectorAll(".chg").forEach(function (span) {
            var name = span.querySelector("b").textContent;
            var text = span.textContent.slice(name.length + 1);
            values[name] = text.split(" → ").slice(1).join(" → ");
            if (r === tr) { changedHere[name] = true; }
          });
        }
        if (r === tr) { break; }
      }
      rows.forEach(function (r) { r.classList.remove("picked"); });
      tr.classList.add("picked");
      var body = panel.querySelector("tbody");
      body.textContent = "";
      state.fields.forEach(function (name) {
        var row = body.insertRow();
        if (changedHere[name]) { row.className = "changed"; }
        row.insertCell().textContent = name;
        row.insertCell().textContent = name in values ? values[name] : "?";
      });
      panel.querySelector(".when").textContent =
        (obj ? obj + " " : "") + "at " + tr.cells[0].textContent + " ms, " +
        tr.cells[callCell].textContent.trim();
      panel.hidden = false;
    });
    panel.querySelector("button").addEventListener("click", function () { panel.hidden = true; });
  }
}());

/* Changes page: an interactive step plot per field (drag to zoom into a time window,
   double-click to zoom out), drawn from the JSON island #field-series. */
(function () {
  "use strict";
  var island = document.getElementById("field-series");
  if (!island) { return; }
  var data = JSON.parse(island.textContent), ns = "http://www.w3.org/2000/svg";
  function el(name, attrs, parent) {
    var e = document.createElementNS(ns, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(e); }
    return e;
  }
  document.querySelectorAll("svg[data-series]").forEach(function (svg) {
    var s = data[svg.getAttribute("data-series")];
    if (!s || !s.t.length) { return; }
    var W = 800, H = 180, L = 120, R = 10, T = 8, B = 22;
    var ys = s.y, ymin = Math.min.apply(null, ys), ymax = Math.max.apply(null, ys);
    if (ymin === ymax) { ymin -= 1; ymax += 1; }
    var full = [s.t[0], Math.max(s.end, s.t[s.t.length - 1] + 1e-6)];
    var view = full.slice();
    function draw() {
      svg.textContent = "";
      var sx = function (t) { return L + (t - view[0]) / (view[1] - view[0]) * (W - L - R); };
      var sy = function (y) { return T + (ymax - y) / (ymax - ymin) * (H - T - B); };
      el("rect", { x: L, y: T, width: W - L - R, height: H - T - B, "class": "plot-bg" }, svg);
      var ticks = s.ticks || [];
      if (!ticks.length) {
        for (var k = 0; k <= 4; k += 1) {
          var v = ymin + (ymax - ymin) * k / 4;
          ticks.push([v, String(Math.round(v * 100) / 100)]);
        }
      }
      ticks.forEach(function (tk) {
        el("line", { x1: L, x2: W - R, y1: sy(tk[0]), y2: sy(tk[0]), "class": "grid" }, svg);
        var tx = el("text", { x: L - 4, y: sy(tk[0]) + 3, "class": "ytick" }, svg);
        tx.textContent = tk[1];
      });
      for (var j = 0; j <= 4; j += 1) {
        var tt = view[0] + (view[1] - view[0]) * j / 4;
        var lx = el("text", { x: sx(tt), y: H - 6, "class": "xtick",
          "text-anchor": j === 0 ? "start" : j === 4 ? "end" : "middle" }, svg);
        lx.textContent = tt.toFixed(3) + " ms";
      }
      var d = "", i;
      for (i = 0; i < s.t.length; i += 1) {
        var x = sx(s.t[i]), y = sy(ys[i]);
        var next = i + 1 < s.t.length ? s.t[i + 1] : full[1];
        d += (i ? "L" + x.toFixed(1) + "," + y.toFixed(1) : "M" + x.toFixed(1) + "," + y.toFixed(1)) +
          "L" + sx(next).toFixed(1) + "," + y.toFixed(1);
      }
      var clip = el("clipPath", { id: svg.id + "-clip" }, svg);
      el("rect", { x: L, y: 0, width: W - L - R, height: H }, clip);
      el("path", { d: d, "class": "series", "clip-path": "url(#" + svg.id + "-clip)" }, svg);
      for (i = 0; i < s.t.length; i += 1) {
        if (s.t[i] < view[0] || s.t[i] > view[1]) { continue; }
        var c = el("circle", { cx: sx(s.t[i]), cy: sy(ys[i]), r: 3, "class": "point" }, svg);
        el("title", {}, c).textContent = s.t[i].toFixed(6) + " ms: " + s.label[i];
      }
      svg._sx = sx;
    }
    draw();
    var start = null, band = null;
    function tAt(ev) {
      var box = svg.getBoundingClientRect();
      var x = (ev.clientX - box.left) / box.width * W;
      return view[0] + (x - L) / (W - L - R) * (view[1] - view[0]);
    }
    svg.addEventListener("mousedown", function (ev) {
      start = tAt(ev); ev.preventDefault();
      band = el("rect", { y: T, height: H - T - B, width: 0, "class": "selection" }, svg);
    });
    svg.addEventListener("mousemove", function (ev) {
      if (start === null) { return; }
      var a = svg._sx(Math.min(start, tAt(ev))), b = svg._sx(Math.max(start, tAt(ev)));
      band.setAttribute("x", a); band.setAttribute("width", b - a);
    });
    svg.addEventListener("mouseup", function (ev) {
      if (start === null) { return; }
      var a = Math.min(start, tAt(ev)), b = Math.max(start, tAt(ev));
      start = null;
      if (b - a > (view[1] - view[0]) / 200) {
        view = [a, b];
        draw();
      } else if (band) {
        band.remove();  // a click: nothing to zoom into (and a double-click zooms out)
      }
    });
    svg.addEventListener("dblclick", function () { view = full.slice(); draw(); });
  });
}());
