/* ctracer report: the interactive call graph (Cytoscape.js with the dagre layout, both
   vendored beside this file) and the flame view (hand-written: positioned elements),
   drawn from the page's JSON island #views-data (see ctracer/report/views.py).  No
   network.  Every name from the trace is data: put in the graph as a label (drawn on a
   canvas) or in the page as text, never as markup. */
(function () {
  "use strict";
  var island = document.getElementById("views-data");
  if (!island) { return; }
  var V = JSON.parse(island.textContent);
  // the vendored libraries sit beside this script; they are loaded when the graph is
  // first scrolled to, so a page opens as fast without them
  var here = document.currentScript ? document.currentScript.src : "";
  var staticDir = here.slice(0, here.lastIndexOf("/") + 1);

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = text; }
    if (cls) { e.className = cls; }
    return e;
  }
  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }
  function link(href, text) {
    var a = el("a", text);
    a.href = href;
    return a;
  }
  function duration(ns) {
    if (ns >= 1e9) { return (ns / 1e9).toFixed(3) + " s"; }
    if (ns >= 1e6) { return (ns / 1e6).toFixed(3) + " ms"; }
    if (ns >= 1e3) { return (ns / 1e3).toFixed(1) + " µs"; }
    return Math.round(ns) + " ns";
  }
  // where a function's rows are: its first row, and the timeline filtered to it
  function rowHref(page, seq) {
    return page >= 0 ? V.pages[page] + "#e" + seq : null;
  }
  function functionRowsHref(name) {
    return V.pages[0] + "#" + new URLSearchParams({ fn: name }).toString();
  }
  function panelLinks(panel, name, page, seq, stem) {
    var p = el("p", null, "links");
    var first = rowHref(page, seq);
    if (first) { p.appendChild(link(first, "first call's row")); p.appendChild(document.createTextNode(" · ")); }
    p.appendChild(link(functionRowsHref(name), "every row of " + name));
    if (stem) {
      p.appendChild(document.createTextNode(" · "));
      p.appendChild(link(V.methods + "#fn-" + stem, "methods entry"));
    }
    panel.appendChild(p);
  }
  function closeButton(panel) {
    var b = el("button", "close");
    b.type = "button";
    b.className = "close";
    b.addEventListener("click", function () { panel.hidden = true; });
    panel.appendChild(b);
  }

  /* ------------------------------------------------------------ call graph */
  function callGraph(G) {
    var section = document.getElementById("graph-view");
    var box = document.getElementById("graph-canvas");
    if (!section || !box || !window.cytoscape) { return null; }
    section.hidden = false;
    var q = function (name) { return section.querySelector("[data-graph='" + name + "']"); };
    var col = {};
    G.node_columns.forEach(function (name, k) { col[name] = k; });
    var fns = G.nodes.map(function (r, i) {
      return { i: i, name: r[col.name], calls: r[col.calls], total: r[col.total_ns],
        changes: r[col.changes], hit: r[col.hit], family: r[col.family], page: r[col.page],
        seq: r[col.seq], stem: r[col.stem] };
    });
    var families = {};
    fns.forEach(function (f) {
      if (!f.family) { return; }
      var fam = families[f.family] || (families[f.family] = { name: f.family, members: [] });
      fam.members.push(f);
    });
    // folded by default when the graph is too big to read unfolded
    var folded = {};
    var foldBox = q("fold");
    var startFolded = fns.length > 60;
    Object.keys(families).forEach(function (k) { folded[k] = startFolded; });
    foldBox.checked = startFolded;

    var threshold = 0, focus = null, pathsOnly = false;
    var counts = fns.map(function (f) { return f.calls; }).concat(G.edges.map(function (e) { return e[2]; }));
    var steps = counts.filter(function (v, i, a) { return a.indexOf(v) === i; }).sort(function (a, b) { return a - b; });
    if (steps.length > 200) {  // at most 200 stops, spread over the counts' range
      var picked = [];
      for (var s = 0; s < 200; s += 1) { picked.push(steps[Math.floor(s * (steps.length - 1) / 199)]); }
      steps = picked.filter(function (v, i, a) { return a.indexOf(v) === i; });
    }
    steps.unshift(0);
    var slider = q("threshold"), sliderValue = q("threshold-value");
    slider.max = String(steps.length - 1);

    var names = document.getElementById("graph-names");
    fns.slice().sort(function (a, b) { return a.name < b.name ? -1 : 1; }).forEach(function (f) {
      var o = document.createElement("option");
      o.value = f.name;
      names.appendChild(o);
    });

    function shown(f) { return f.family && folded[f.family] ? "fam:" + f.family : "f" + f.i; }

    // the graph as shown: functions or their folded families, edges summed
    function elements() {
      var nodes = {}, edges = {}, out = [];
      nodes.root = { data: { id: "root", label: G.root, kind: "root", calls: 0, changes: 0 } };
      fns.forEach(function (f) {
        if (f.calls < threshold) { return; }
        var id = shown(f), n = nodes[id];
        if (!n) {
          var fam = id.indexOf("fam:") === 0;
          n = nodes[id] = { data: { id: id, kind: fam ? "family" : f.hit ? "tracepoint" : "function",
            name: fam ? f.family : f.name, calls: 0, changes: 0, total: 0, members: 0 } };
        }
        n.data.calls += f.calls;
        n.data.changes += f.changes;
        n.data.total += f.total;
        n.data.members += 1;
      });
      G.edges.forEach(function (e) {
        if (e[2] < threshold) { return; }
        var a = e[0] < 0 ? "root" : shown(fns[e[0]]), b = shown(fns[e[1]]);
        if (!nodes[a] || !nodes[b] || a === b) { return; }
        var key = a + ">" + b;
        if (!edges[key]) { edges[key] = { data: { id: key, source: a, target: b, calls: 0 } }; }
        edges[key].data.calls += e[2];
      });
      var most = 1;
      Object.keys(edges).forEach(function (k) { most = Math.max(most, edges[k].data.calls); });
      Object.keys(nodes).forEach(function (id) {
        var d = nodes[id].data;
        if (d.kind === "family") { d.label = d.name + "_* (" + d.members + ")\n" + plural(d.calls, "call"); }
        else if (d.kind !== "root") { d.label = d.name + "\n" + plural(d.calls, d.kind === "tracepoint" ? "hit" : "call"); }
        d.w = Math.max(60, 7 * Math.max.apply(null, String(d.label).split("\n").map(function (l) { return l.length; })) + 16);
        out.push(nodes[id]);
      });
      Object.keys(edges).forEach(function (k) {
        var d = edges[k].data;
        d.width = 1 + 5 * Math.log(1 + d.calls) / Math.log(1 + most);
        out.push(edges[k]);
      });
      return out;
    }

    var cy = window.cytoscape({
      container: box, minZoom: 0.05, maxZoom: 4,
      boxSelectionEnabled: false,
      style: [
        { selector: "node", style: { shape: "round-rectangle", "background-color": "#eef3fb",
          "border-width": 1, "border-color": "#7d8896", label: "data(label)", "text-wrap": "wrap",
          "text-valign": "center", "font-size": 11, "font-family": "DejaVu Sans, sans-serif",
          width: "data(w)", height: 34, color: "#1b2430" } },
        { selector: "node[kind = 'root']", style: { shape: "ellipse", "background-color": "#fff" } },
        { selector: "node[kind = 'family']", style: { "background-color": "#d9dde3", "border-style": "dashed", "border-width": 2 } },
        { selector: "node[kind = 'tracepoint']", style: { shape: "cut-rectangle", "background-color": "#f4efe1" } },
        { selector: "node[changes > 0]", style: { "border-color": "#c62828", "border-width": 3, color: "#8e1b1b" } },
        { selector: "edge", style: { width: "data(width)", "line-color": "#98a3b1", "target-arrow-color": "#98a3b1",
          "target-arrow-shape": "triangle", "curve-style": "bezier", "arrow-scale": 0.8,
          label: "data(calls)", "font-size": 9, color: "#5b6675", "text-background-color": "#fff",
          "text-background-opacity": 0.8, "text-background-padding": 1 } },
        { selector: ".faded", style: { opacity: 0.12 } },
        { selector: ".on-path", style: { "line-color": "#c62828", "target-arrow-color": "#c62828" } },
        { selector: ".found", style: { "background-color": "#ffe066", "border-color": "#a07800", "border-width": 3 } },
        { selector: ":selected", style: { "overlay-color": "#1a56db", "overlay-opacity": 0.15, "overlay-padding": 4 } },
      ],
    });

    var status = q("status");
    function layout(done) {
      var t0 = performance.now();
      var l = cy.layout({ name: "dagre", rankDir: "LR", nodeSep: 8, rankSep: 60, edgeSep: 4,
        animate: false, fit: true, padding: 20 });
      l.one("layoutstop", function () {
        section.setAttribute("data-layout-ms", String(Math.round(performance.now() - t0)));
        if (done) { done(); }
      });
      l.run();
    }
    function restyle() {
      cy.elements().removeClass("faded on-path");
      if (focus && cy.getElementById(focus).length) {
        var depth = +q("depth").value, at = cy.getElementById(focus), keep = at;
        var up = at, down = at;
        for (var k = 0; k < depth; k += 1) {
          up = up.incomers(); down = down.outgoers();
          keep = keep.union(up).union(down);
          up = up.nodes(); down = down.nodes();
        }
        keep = keep.union(keep.nodes().edgesWith(keep.nodes()).filter(function (e) {
          return keep.has(e.source()) && keep.has(e.target()) && (keep.has(e));
        }));
        cy.elements().not(keep).addClass("faded");
      }
      // the functions that changed fields, and every path from the root to them
      if (pathsOnly) {
        var changed = cy.nodes("[changes > 0]");
        var toward = changed.predecessors();
        toward.edges().addClass("on-path");
        cy.elements().not(changed.union(toward)).addClass("faded");
      }
    }
    function redraw(done) {
      var keepFocus = focus;
      cy.elements().remove();
      cy.add(elements());
      focus = keepFocus && cy.getElementById(keepFocus).length ? keepFocus : null;
      layout(function () {
        restyle();
        var hidden = fns.filter(function (f) { return f.calls < threshold; }).length;
        var fams = Object.keys(folded).filter(function (k) { return folded[k]; }).length;
        status.textContent = cy.nodes().length - 1 + " boxes shown" +
          (fams ? ", " + fams + " families folded" : "") +
          (hidden ? ", " + hidden + " functions under " + threshold + " calls hidden" : "");
        if (done) { done(); }
      });
    }

    var panel = q("panel");
    function showPanel(node) {
      var d = node.data();
      panel.textContent = "";
      panel.hidden = false;
      closeButton(panel);
      if (d.kind === "root") {
        panel.appendChild(el("strong", d.label));
        panel.appendChild(el("p", "Calls with no traced caller hang from here."));
        return;
      }
      panel.appendChild(el("strong", d.kind === "family" ? d.name + "_* (" + d.members + " functions)" : d.name));
      var facts = el("p", plural(d.calls, d.kind === "tracepoint" ? "hit" : "call") +
        (d.total && d.calls ? ", average " + duration(d.total / d.calls) : "") +
        (d.changes ? ", " + d.changes + " field change" + (d.changes === 1 ? "" : "s") : ""));
      panel.appendChild(facts);
      var buttons = el("p");
      function button(label, act) {
        var b = el("button", label);
        b.type = "button";
        b.addEventListener("click", act);
        buttons.appendChild(b);
      }
      if (d.kind === "family") {
        button("unfold", function () { unfold(d.name); });
      } else {
        var f = fns[+d.id.slice(1)];
        button("focus", function () { focusOn(d.id); });
        if (f.family) { button("fold " + f.family + "_*", function () { folded[f.family] = true; redraw(); }); }
        panelLinks(panel, f.name, f.page, f.seq, f.stem);
      }
      panel.appendChild(buttons);
    }
    // show these elements, no closer than a readable zoom (one box alone fills no screen)
    function fitTo(eles) {
      cy.fit(eles, 40);
      if (cy.zoom() > 1.2) {
        var bb = eles.boundingBox();
        cy.zoom({ level: 1.2, position: { x: (bb.x1 + bb.x2) / 2, y: (bb.y1 + bb.y2) / 2 } });
      }
    }
    // focus: the function and its callers and callees laid out again by themselves (in
    // the whole graph's layout they are scattered), the rest faded where it was
    function focusOn(id) {
      focus = id;
      restyle();
      var kept = cy.elements().not(".faded");
      var l = kept.layout({ name: "dagre", rankDir: "LR", nodeSep: 8, rankSep: 60, edgeSep: 4,
        animate: false, fit: false });
      l.one("layoutstop", function () { fitTo(kept.nodes()); });
      l.run();
    }
    function unfold(family, done) {
      folded[family] = false;
      foldBox.checked = Object.keys(folded).some(function (k) { return folded[k]; });
      redraw(done);
    }

    cy.on("tap", "node", function (ev) {
      var node = ev.target;
      if (node.data("kind") === "family") { unfold(node.data("name")); return; }
      showPanel(node);
    });
    cy.on("tap", function (ev) { if (ev.target === cy) { panel.hidden = true; } });

    foldBox.addEventListener("change", function () {
      Object.keys(folded).forEach(function (k) { folded[k] = foldBox.checked; });
      redraw();
    });
    q("unfold-all").addEventListener("click", function () {
      Object.keys(folded).forEach(function (k) { folded[k] = false; });
      foldBox.checked = false;
      redraw();
    });
    q("unfocus").addEventListener("click", function () { focus = null; restyle(); layout(); });
    q("depth").addEventListener("change", function () { if (focus) { focusOn(focus); } });
    q("paths").addEventListener("change", function () { pathsOnly = q("paths").checked; restyle(); });
    var sliderTimer = null;
    slider.addEventListener("input", function () {
      threshold = steps[+slider.value] || 0;
      sliderValue.textContent = String(threshold);
      clearTimeout(sliderTimer);
      sliderTimer = setTimeout(function () { redraw(); }, 150);
    });
    function zoomBy(factor) {
      cy.zoom({ level: cy.zoom() * factor, renderedPosition: { x: box.clientWidth / 2, y: box.clientHeight / 2 } });
    }
    q("zoom-in").addEventListener("click", function () { zoomBy(1.5); });
    q("zoom-out").addEventListener("click", function () { zoomBy(1 / 1.5); });
    q("fit").addEventListener("click", function () { cy.fit(undefined, 20); });

    // find: every function whose name holds the text; families holding one unfold
    var search = q("search");
    function find(text) {
      text = text.trim().toLowerCase();
      cy.nodes().removeClass("found");
      if (!text) { status.textContent = ""; return; }
      var hits = fns.filter(function (f) { return f.name.toLowerCase().indexOf(text) >= 0 && f.calls >= threshold; });
      var closed = {};
      hits.forEach(function (f) { if (f.family && folded[f.family]) { closed[f.family] = 1; } });
      function mark() {
        var found = cy.collection();
        hits.forEach(function (f) { found = found.union(cy.getElementById("f" + f.i)); });
        found.addClass("found");
        if (found.length) { fitTo(found.length === 1 ? found.closedNeighborhood() : found); }
        if (found.length === 1) { showPanel(found[0]); }
        status.textContent = hits.length ? hits.length + " function" + (hits.length === 1 ? "" : "s") + " found" : "no function named so";
        section.setAttribute("data-found", String(found.length));
      }
      var fams = Object.keys(closed);
      if (fams.length && hits.length <= 50) {
        fams.forEach(function (k) { folded[k] = false; });
        foldBox.checked = Object.keys(folded).some(function (k) { return folded[k]; });
        redraw(mark);
      } else {
        mark();
      }
    }
    var searchTimer = null;
    search.addEventListener("input", function () {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(function () { find(search.value); }, 200);
    });
    search.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter") { clearTimeout(searchTimer); find(search.value); }
    });

    redraw(function () { section.setAttribute("data-ready", "1"); });
    window.ctracerGraph = cy;  // for the tests and benchmarks that drive the page
    return cy;
  }

  /* ------------------------------------------------------------ flame view */
  function flameView(F) {
    var section = document.getElementById("flame-view");
    if (!section) { return; }
    section.hidden = false;
    var q = function (name) { return section.querySelector("[data-flame='" + name + "']"); };
    var chart = q("chart"), panel = q("panel"), status = q("status"), weightSel = q("weight");
    var n = F.p.length, ROW = 18, i;
    if (!F.timed) { weightSel.value = "calls"; weightSel.querySelector("option[value=time]").disabled = true; }
    var kids = [], roots = [];
    for (i = 0; i < n; i += 1) { kids.push([]); }
    for (i = 0; i < n; i += 1) { if (F.p[i] >= 0) { kids[F.p[i]].push(i); } else { roots.push(i); } }
    function byName(a, b) { var x = F.names[F.f[a]], y = F.names[F.f[b]]; return x < y ? -1 : x > y ? 1 : a - b; }
    kids.forEach(function (k) { k.sort(byName); });
    roots.sort(byName);
    var depthOf = new Array(n), maxDepth = 0;
    for (i = 0; i < n; i += 1) {  // parents come first
      depthOf[i] = F.p[i] >= 0 ? depthOf[F.p[i]] + 1 : 1;
      if (depthOf[i] > maxDepth) { maxDepth = depthOf[i]; }
    }
    // a frame's weight: its own calls or self time plus its callees' (children fit)
    var weight = { time: new Array(n), calls: new Array(n) };
    for (i = n - 1; i >= 0; i -= 1) {
      var t = F.s[i], c = F.c[i];
      kids[i].forEach(function (k) { t += weight.time[k]; c += weight.calls[k]; });
      weight.time[i] = t; weight.calls[i] = c;
    }
    var ALL = -1, zoomed = ALL, search = "";
    function w(node) {
      var by = weight[weightSel.value];
      if (node === ALL) { return roots.reduce(function (s, r) { return s + by[r]; }, 0); }
      return by[node];
    }
    function label(node) { return node === ALL ? "all" : F.names[F.f[node]]; }
    function path(node) { var out = []; while (node >= 0) { out.unshift(node); node = F.p[node]; } return out; }

    function draw() {
      var t0 = performance.now();
      var width = chart.clientWidth || 1000, by = weightSel.value, drawn = 0;
      chart.textContent = "";
      var frag = document.createDocumentFragment();
      // the zoomed frame's callers, full width above it
      var above = zoomed === ALL ? [] : path(zoomed);
      var top = [ALL].concat(above.slice(0, -1));
      top.forEach(function (node, k) { frag.appendChild(frame(node, 0, width, k, true)); drawn += 1; });
      var base = top.length, total = w(zoomed);
      function place(node, x, level, span) {
        if (span < 1) { return; }
        frag.appendChild(frame(node, x, span, level, false));
        drawn += 1;
        var at = x;
        kids[node].forEach(function (k) {
          var s = total ? span * weight[by][k] / w(node) : 0;
          if (w(node) === 0) { s = 0; }
          place(k, at, level + 1, s);
          at += s;
        });
      }
      if (zoomed === ALL) {
        var x = 0;
        roots.forEach(function (r) {
          var s = total ? width * weight[by][r] / total : 0;
          place(r, x, base, s);
          x += s;
        });
      } else {
        place(zoomed, 0, base, width);
      }
      chart.appendChild(frag);
      chart.style.height = (maxDepth + 2) * ROW + "px";
      status.textContent = (zoomed === ALL ? "" : "zoomed into " + label(zoomed) + "; ") + drawn +
        " frames drawn" + (F.dropped ? "; " + F.dropped + " small frames folded into their callers" : "");
      section.setAttribute("data-zoomed", zoomed === ALL ? "" : label(zoomed));
      section.setAttribute("data-draw-ms", String(Math.round(performance.now() - t0)));
    }
    function frame(node, x, span, level, isAbove) {
      var d = el("div", null, "frame" + (isAbove ? " above" : "") +
        (node !== ALL && F.x[node] ? " changed" : "") + (node !== ALL && F.h[node] ? " hit" : ""));
      d.style.left = x + "px";
      d.style.width = Math.max(span - 1, 1) + "px";
      d.style.top = level * ROW + "px";
      var name = label(node);
      if (search && name.toLowerCase().indexOf(search) >= 0) { d.className += " match"; }
      d.setAttribute("data-node", String(node));
      if (span > 30) { d.textContent = name; }
      var by = weightSel.value, v = w(node);
      d.title = name + ": " + (by === "time" ? duration(v) : v + " calls") +
        (node !== ALL ? (F.x[node] ? ", " + F.x[node] + " field changes" : "") : "");
      return d;
    }
    chart.addEventListener("click", function (ev) {
      var d = ev.target.closest(".frame");
      if (!d) { return; }
      var node = +d.getAttribute("data-node");
      if (node === ALL || d.classList.contains("above")) { zoomed = node === ALL ? ALL : node; }
      else { zoomed = node; }
      draw();
      showPanel(node);
    });
    function showPanel(node) {
      if (node === ALL) { panel.hidden = true; return; }
      panel.textContent = "";
      panel.hidden = false;
      closeButton(panel);
      panel.appendChild(el("strong", path(node).map(label).join(" → ")));
      var lines = [F.c[node] + (F.h[node] ? " hits" : " calls") + " at this stack",
        weight.calls[node] + " calls in all, callees included"];
      if (F.timed) {
        lines.push(duration(weight.time[node]) + " in all, " + duration(F.s[node]) + " in the function itself");
      }
      if (F.x[node]) { lines.push(F.x[node] + " field changes made here"); }
      if (F.more[node]) { lines.push(F.more[node] + " smaller frames below folded into this one"); }
      lines.forEach(function (l) { panel.appendChild(el("p", l)); });
      panelLinks(panel, label(node), F.page[node], F.seq[node], "");
    }
    weightSel.addEventListener("change", draw);
    q("reset").addEventListener("click", function () { zoomed = ALL; panel.hidden = true; draw(); });
    var searchBox = q("search"), searchTimer = null;
    searchBox.addEventListener("input", function () {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(function () { search = searchBox.value.trim().toLowerCase(); draw(); }, 150);
    });
    var resized = null;
    window.addEventListener("resize", function () { clearTimeout(resized); resized = setTimeout(draw, 150); });
    draw();
    section.setAttribute("data-ready", "1");
  }

  // each view is drawn when it comes near the screen (its section shows a line until then)
  function whenSeen(section, draw) {
    if (!section) { return; }
    section.hidden = false;
    var waiting = el("p", "drawing…", "hint pending");
    section.appendChild(waiting);
    var go = function () { waiting.remove(); draw(); };
    if (!("IntersectionObserver" in window)) { go(); return; }
    var seen = new IntersectionObserver(function (entries) {
      if (entries.some(function (e) { return e.isIntersecting; })) { seen.disconnect(); go(); }
    }, { rootMargin: "300px" });
    seen.observe(section);
  }
  function loadScripts(list, done, failed) {  // in order: dagre registers with cytoscape
    if (!list.length) { done(); return; }
    var tag = document.createElement("script");
    tag.src = staticDir + list[0];
    tag.onload = function () { loadScripts(list.slice(1), done, failed); };
    tag.onerror = function () { failed(list[0]); };
    document.body.appendChild(tag);
  }
  if (V.graph) {
    whenSeen(document.getElementById("graph-view"), function () {
      loadScripts(window.cytoscape ? [] : ["cytoscape.min.js", "cytoscape-dagre.min.js"],
        function () { callGraph(V.graph); },
        function (name) {
          document.querySelector("[data-graph=status]").textContent = "could not load " + name;
        });
    });
  }
  if (V.flame) { whenSeen(document.getElementById("flame-view"), function () { flameView(V.flame); }); }
}());
