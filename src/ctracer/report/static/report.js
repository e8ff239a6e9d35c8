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

  document.querySelectorAll("table.sortable:not([data-drawn])").forEach(function (table) {
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

/* Index: the object table, drawn from its data file (objects.js, which sets
   CTRACER_OBJECTS: see ctracer/report/index_data.py) a page of objects at a time; the
   filter searches every object and a header click sorts all of them, not only the page
   shown.  No network: the data file is a <script src> beside the page. */
(function () {
  "use strict";
  var table = document.getElementById("objects");
  var D = window.CTRACER_OBJECTS;
  if (!table || !table.tBodies.length || !D || !D.rows.length) { return; }
  var PAGE = 500;
  var body = table.tBodies[0];
  var col = {};
  D.columns.forEach(function (name, k) { col[name] = k; });
  // the data's shorthands (index_data.py): a directory named as the label, repeated texts
  D.rows.forEach(function (r) {
    if (r[col.dir] === 1) { r[col.dir] = r[col.label]; }
    var s = r[col.summary] || [];
    for (var k = 0; k < s.length; k++) {
      if (typeof s[k] === "number") { s[k] = D.texts[s[k]]; }
    }
  });
  // the table's columns, each with the data field it shows and how it sorts
  var summaries = D.summary_columns || [];
  var counts = D.counts || ["calls"];  // calls, tracepoint hits: what the probes counted
  var shown = ["label"].concat(summaries.map(function (_, k) { return "summary:" + k; }),
    ["lifetime", "began", "first", "last", "events"], counts, ["changes", "fields"]);
  var numeric = { lifetime: 1, first: 1, last: 1, events: 1, calls: 1, hits: 1, changes: 1,
    fields: 1 };
  var all = D.rows.map(function (r, i) {
    return { r: r, i: i, why: D.why[r[col.began]] };
  });
  function value(o, name) {
    if (name === "began") { return o.why; }
    if (name.indexOf("summary:") === 0) {
      var t = String((o.r[col.summary] || [])[+name.slice(8)] || "");
      return /^-?\d+(\.\d+)?$/.test(t) ? parseFloat(t) : t.toLowerCase();  // numbers by value
    }
    var v = o.r[col[name]];
    return numeric[name] ? parseFloat(v) : String(v).toLowerCase();
  }
  function text(o) {
    if (o.text === undefined) {
      o.text = [o.r[col.label], o.why, o.r[col.dir]].concat(o.r[col.summary] || [])
        .join(" ").toLowerCase();
    }
    return o.text;
  }
  var q = function (name) { return document.querySelector("[data-objects='" + name + "']"); };
  var filterBox = q("filter"), count = q("shown"), pager = q("pager");
  var kept = all, page = 0;

  function cell(tr, content, cls) {
    var td = tr.insertCell();
    if (cls) { td.className = cls; }
    if (content && content.nodeType) { td.appendChild(content); } else { td.textContent = content; }
    return td;
  }
  function link(href, label) {
    var a = document.createElement("a");
    a.href = href;
    a.textContent = label;
    return a;
  }
  function row(o) {
    var r = o.r, dir = r[col.dir], tr = document.createElement("tr");
    cell(tr, dir ? link(dir + "/index.html", r[col.label]) : r[col.label], "mono object");
    summaries.forEach(function (_, k) {  // a path of values breaks after its arrows only
      cell(tr, String((r[col.summary] || [])[k] || "").replace(/ → /g, "\u00a0→ "), "summary");
    });
    cell(tr, String(r[col.lifetime]), "num");
    cell(tr, o.why, "began").title = o.why;
    cell(tr, r[col.first], "num");
    cell(tr, r[col.last], "num");
    cell(tr, String(r[col.events]), "num");
    counts.forEach(function (name) { cell(tr, String(r[col[name]] || 0), "num"); });
    var changes = String(r[col.changes]);
    cell(tr, dir && r[col.changes] ? link(dir + "/changes.html", changes) : changes, "num");
    cell(tr, String(r[col.fields]), "num");
    return tr;
  }
  function pageButton(label, target, current) {
    var b = document.createElement(current ? "strong" : "button");
    b.textContent = label;
    if (!current) {
      b.type = "button";
      b.addEventListener("click", function () { page = target; draw(); });
    }
    pager.appendChild(b);
  }
  function drawPager(pages) {
    pager.textContent = "";
    pager.hidden = pages < 2;
    if (pages < 2) { return; }
    if (page > 0) { pageButton("‹ previous", page - 1, false); }
    for (var p = 0; p < pages; p += 1) {
      if (p === 0 || p === pages - 1 || Math.abs(p - page) <= 3) {
        pageButton(String(p + 1), p, p === page);
      } else if (p === 1 || p === pages - 2) {
        pager.appendChild(document.createTextNode("…"));
      }
    }
    if (page < pages - 1) { pageButton("next ›", page + 1, false); }
  }
  function draw() {
    var pages = Math.max(1, Math.ceil(kept.length / PAGE));
    page = Math.min(page, pages - 1);
    var start = page * PAGE, end = Math.min(kept.length, start + PAGE);
    var frag = document.createDocumentFragment();
    kept.slice(start, end).forEach(function (o) { frag.appendChild(row(o)); });
    body.textContent = "";
    body.appendChild(frag);
    if (count) {
      count.textContent = (kept.length === all.length ? all.length + " objects"
        : kept.length + " of " + all.length + " objects match") +
        (kept.length > end - start ? ", " + (start + 1) + "–" + end + " shown" : "");
    }
    drawPager(pages);
  }
  function filter() {
    var want = filterBox ? filterBox.value.trim().toLowerCase() : "";
    kept = want ? all.filter(function (o) { return text(o).indexOf(want) >= 0; }) : all;
    page = 0;
    draw();
  }
  // the filter lives in the address (#q=TEXT), so a filtered list can be linked to
  function fromHash() {
    if (!filterBox) { return; }
    var p = new URLSearchParams(window.location.hash.slice(1));
    if (filterBox.value !== (p.get("q") || "")) { filterBox.value = p.get("q") || ""; filter(); }
  }
  if (filterBox) {
    filterBox.addEventListener("input", function () {
      filter();
      var want = filterBox.value.trim();
      history.replaceState(null, "", want ? "#" + new URLSearchParams({ q: want }).toString()
        : window.location.pathname + window.location.search);
    });
    window.addEventListener("hashchange", fromHash);
  }

  var headers = table.tHead ? table.tHead.rows[0].cells : [];
  Array.prototype.forEach.call(headers, function (th, column) {
    th.addEventListener("click", function () {
      var ascending = th.getAttribute("aria-sort") !== "ascending", name = shown[column];
      Array.prototype.forEach.call(headers, function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      all.forEach(function (o) { o.k = value(o, name); });
      all.sort(function (a, b) {
        var na = typeof a.k === "number", nb = typeof b.k === "number";
        var c = na !== nb ? (na ? -1 : 1) : a.k < b.k ? -1 : a.k > b.k ? 1 : 0;
        return (ascending ? c : -c) || a.i - b.i;
      });
      filter();
    });
  });
  filter();
  fromHash();
}());

/* Timeline: the rows of the page, drawn from its data file (rows-N.js, which sets
   CTRACER_ROWS: see ctracer/report/timeline.py) a screenful at a time; search, filters by
   function / thread / field changed, a time brush, and a panel with every field's value
   at the clicked row.  No network: the data file is a <script src> beside the page, or
   the same script inside a short page. */
(function () {
  "use strict";
  var table = document.getElementById("timeline");
  var D = window.CTRACER_ROWS;
  if (!table || !table.tBodies.length || !D) { return; }
  var SCREEN = 2000;
  var body = table.tBodies[0];
  var withObject = table.classList.contains("with-object");
  var callCell = withObject ? 3 : 2;

  function esc(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;")
      .replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function ms(ns) { return (ns / 1e6).toFixed(6); }

  // one item per table row: a traced caller's changes get a row of their own (c<seq>)
  // before the row that showed them (e<seq>)
  function itemsOf(D) {
    var items = [], n = D.seq.length, i;
    for (i = 0; i < n; i += 1) {
      var ph = D.ph[i], entry = ph === D.entry, point = ph === D.point;
      var label = D.o ? D.objects[D.o[i]][0] : "";
      var base = { seq: D.seq[i], t: D.t[i], th: D.threads[D.th[i]], d: D.d[i],
        o: label, obj: D.o ? D.objects[D.o[i]] : null, row: i };
      var fn = D.functions[String(D.fn[i])];
      var chg = D.changes[String(i)], tags = D.tags[String(i)] || [];
      var mine = null, cls = entry ? "entry" : point ? "tracepoint" : "exit";
      if (chg) {
        var cause = D.causes[chg[0]], list = [];
        for (var k = 1; k + 2 < chg.length; k += 3) {
          list.push([D.fields[chg[k]], chg[k + 1], chg[k + 2]]);
        }
        if (cause[0]) {
          var c = Object.assign({}, base, { id: "c" + base.seq, cls: "by-caller changed",
            fn: cause[2], arrow: "⋯", d: Math.max(0, base.d - 1), dur: "", ret: "",
            tags: [["tag", cause[3]]], changes: list, why: cause[1] });
          items.push(c);
        } else {
          mine = list;
          cls += " changed";
        }
      }
      var tagList = tags.map(function (t) {
        if (t[0] !== "args") { cls += " " + t[0]; }
        return [t[0] === "args" ? "args" : "tag", t[1]];
      });
      items.push(Object.assign(base, { id: "e" + base.seq, cls: cls, fn: fn,
        arrow: entry ? "→" : point ? "•" : "←", dur: D.dur[i], ret: D.ret[i], tags: tagList,
        changes: mine || [], why: mine ? D.causes[chg[0]][1] : "" }));
    }
    items.forEach(function (it, j) { it.at = j; it.changed = it.changes.length > 0; });
    return items;
  }
  var items = itemsOf(D), byId = {};
  items.forEach(function (it) { byId[it.id] = it; });

  function text(it) {
    if (it.text === undefined) {
      it.text = [ms(it.t), it.th, it.o, it.fn, it.tags.map(function (t) { return t[1]; }).join(" "),
        it.dur, it.ret, it.changes.map(function (c) { return c.join(" "); }).join(" ")]
        .join(" ").toLowerCase();
    }
    return it.text;
  }
  function rowHtml(it) {
    var title = it.changes.map(function (c) {
      return c[0] + ": " + c[1] + " → " + c[2] + " (" + it.why + ")";
    }).join("\n");
    var h = '<tr id="' + it.id + '" class="' + it.cls + '"' +
      (title ? ' title="' + esc(title) + '"' : "") + ' data-fn="' + esc(it.fn) + '"' +
      (it.obj ? ' data-o="' + esc(it.o) + '"' : "") + '><td><a href="#' + it.id + '">' +
      ms(it.t) + "</a></td><td>" + esc(it.th) + "</td>";
    if (withObject) {
      h += it.obj && it.obj[1] ? '<td><a href="' + esc(it.obj[1]) + '">' + esc(it.o) + "</a></td>"
        : "<td>" + esc(it.o) + "</td>";
    }
    h += '<td style="--depth:' + it.d + '"><i>' + it.arrow + "</i> " + esc(it.fn);
    it.tags.forEach(function (t) { h += ' <span class="' + t[0] + '">' + esc(t[1]) + "</span>"; });
    h += "</td><td>" + esc(it.dur) + "</td><td>" + esc(it.ret) + "</td><td>";
    it.changes.forEach(function (c) {
      h += '<span class="chg"><b>' + esc(c[0]) + "</b> " + esc(c[1]) + " → " + esc(c[2]) + "</span>";
    });
    return h + "</td></tr>";
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
  items.forEach(function (it) {
    fnSet[it.fn] = 1; threadSet[it.th] = 1;
    it.changes.forEach(function (c) { fieldSet[c[0]] = 1; });
  });
  var q = function (name) { return document.querySelector("[data-timeline='" + name + "']"); };
  var search = q("search"), fnSel = q("function"), threadSel = q("thread"), fieldSel = q("field");
  var fromBox = q("from"), toBox = q("to"), shown = q("shown"), more = q("more");
  var earlier = q("earlier");
  var onlyChanged = document.querySelector("input[data-only-changed]");
  // a paged timeline lists what every page holds (pages.js): the filters offer it all
  var P = window.CTRACER_PAGES, here = parseInt(table.getAttribute("data-page") || "0", 10) - 1;
  options(fnSel, P ? P.functions.slice() : Object.keys(fnSet));
  options(threadSel, P ? P.threads.slice() : Object.keys(threadSet));
  options(fieldSel, P ? P.fields.slice() : Object.keys(fieldSet));

  // the rows drawn: kept[first .. first + limit) (a row linked deep in a long page is
  // drawn with its neighbours, not with every row before it)
  var kept = items, first = 0, limit = SCREEN;
  function criteria() {
    return {
      want: search ? search.value.trim().toLowerCase() : "",
      fn: fnSel ? fnSel.value : "", th: threadSel ? threadSel.value : "",
      field: fieldSel ? fieldSel.value : "",
      lo: fromBox && fromBox.value !== "" ? parseFloat(fromBox.value) * 1e6 : -Infinity,
      hi: toBox && toBox.value !== "" ? parseFloat(toBox.value) * 1e6 : Infinity,
      changedOnly: !!(onlyChanged && onlyChanged.checked)
    };
  }
  function matches(it, c) {
    return (!c.want || text(it).indexOf(c.want) >= 0) && (!c.fn || it.fn === c.fn) &&
      (!c.th || it.th === c.th) && (!c.changedOnly || it.changed) &&
      (!c.field || it.changes.some(function (x) { return x[0] === c.field; })) &&
      it.t >= c.lo - 0.5 && it.t <= c.hi + 0.5;
  }
  function filter() {
    var c = criteria();
    kept = items.filter(function (it) { return matches(it, c); });
  }
  function draw() {
    if (!items.length) { return; }
    var end = Math.min(kept.length, first + limit);
    body.innerHTML = kept.length ? kept.slice(first, end).map(rowHtml).join("")
      : '<tr><td colspan="7" class="empty">No row on this page matches.</td></tr>';
    if (shown) {
      shown.textContent = kept.length + " of " + items.length + " rows shown" +
        (end - first < kept.length ? " (" + (first + 1) + "–" + end + " drawn)" : "");
    }
    if (more) { more.parentNode.hidden = end >= kept.length; }
    if (earlier) { earlier.parentNode.hidden = first === 0; }
  }
  function apply() {
    // the same rows as drawn: nothing is redrawn (a change event fired by a blur as the
    // user clicks a row must not replace the row under the mouse)
    var before = kept;
    filter();
    searchElsewhere();
    if (first === 0 && limit === SCREEN && before.length === kept.length &&
        before.every(function (it, j) { return kept[j] === it; })) { return; }
    first = 0;
    limit = SCREEN;
    draw();
  }
  [search, fnSel, threadSel, fieldSel, fromBox, toBox, onlyChanged].forEach(function (el) {
    if (el) { el.addEventListener("input", apply); el.addEventListener("change", apply); }
  });

  // the other pages of a paged timeline: when a search or filter is set, each page that
  // may hold matches (by pages.js) has its data file loaded in turn (a <script src>, as
  // the page's own) and searched; the pages with matches are listed as links that open
  // them with the same search.  A newer search cancels the one under way.
  var elsewhere = q("elsewhere"), scanKey = "", scanTimer = null;
  function active(c) {
    return c.want || c.fn || c.th || c.field || c.changedOnly || c.lo > -Infinity ||
      c.hi < Infinity;
  }
  function hashOf(c) {
    var p = new URLSearchParams();
    if (c.want) { p.set("q", search.value.trim()); }
    if (c.fn) { p.set("fn", c.fn); }
    if (c.th) { p.set("thread", c.th); }
    if (c.field) { p.set("field", c.field); }
    if (c.lo > -Infinity) { p.set("from", fromBox.value); }
    if (c.hi < Infinity) { p.set("to", toBox.value); }
    if (c.changedOnly) { p.set("changed", "1"); }
    return "#" + p.toString();
  }
  function mayHold(page, c) {
    function has(list, values, v) { return !v || list.indexOf(values.indexOf(v)) >= 0; }
    return has(page.fn, P.functions, c.fn) && has(page.th, P.threads, c.th) &&
      has(page.field, P.fields, c.field) && page.t[1] >= c.lo - 0.5 && page.t[0] <= c.hi + 0.5;
  }
  var loading = false;  // one data file at a time: each assigns the same variable
  function loadRows(file, done) {
    var tag = document.createElement("script");
    loading = true;
    var finish = function (data) {
      loading = false;
      window.CTRACER_ROWS = D;
      tag.remove();
      done(data);
    };
    tag.onload = function () { finish(window.CTRACER_ROWS !== D ? window.CTRACER_ROWS : null); };
    tag.onerror = function () { finish(null); };
    tag.src = file;
    document.body.appendChild(tag);
  }
  function showFound(found, done, total, c) {
    elsewhere.textContent = "";
    elsewhere.hidden = false;
    var lead = done < total ? "Searching page " + (done + 1) + " of " + total + "… "
      : found.length ? "Matches on other pages: " : "No matches on the other " + (total - 1) +
        " pages.";
    elsewhere.appendChild(document.createTextNode(lead));
    found.forEach(function (f, k) {
      if (k) { elsewhere.appendChild(document.createTextNode(" · ")); }
      var a = document.createElement("a");
      a.href = f.page.page + hashOf(c);
      a.textContent = "page " + f.number + " (" + f.count + " row" + (f.count === 1 ? "" : "s") + ")";
      elsewhere.appendChild(a);
    });
  }
  function scan(c, key) {
    var found = [], total = P.pages.length;
    function step(k) {
      if (key !== scanKey) { return; }
      if (k === here) { step(k + 1); return; }
      showFound(found, Math.min(k, total), total, c);
      if (k >= total) { return; }
      var page = P.pages[k];
      if (!mayHold(page, c)) { step(k + 1); return; }
      if (loading) {  // an older search's file is still loading
        setTimeout(function () { step(k); }, 30);
        return;
      }
      loadRows(page.rows, function (data) {
        if (key !== scanKey) { return; }
        var count = data ? itemsOf(data).filter(function (it) { return matches(it, c); }).length : 0;
        if (count) { found.push({ page: page, number: k + 1, count: count }); }
        step(k + 1);
      });
    }
    step(0);
  }
  function searchElsewhere() {
    if (!P || !elsewhere || here < 0) { return; }
    var c = criteria(), key = JSON.stringify([c.want, c.fn, c.th, c.field, String(c.lo),
      String(c.hi), c.changedOnly]);
    if (key === scanKey) { return; }
    scanKey = key;
    clearTimeout(scanTimer);
    // the page numbers carry the search to the page they open
    document.querySelectorAll("nav.pager a").forEach(function (a) {
      a.setAttribute("href", a.getAttribute("href").split("#")[0] + (active(c) ? hashOf(c) : ""));
    });
    if (!active(c)) { elsewhere.hidden = true; return; }
    elsewhere.hidden = false;
    elsewhere.textContent = "Searching the other " + (P.pages.length - 1) + " pages…";
    scanTimer = setTimeout(function () { scan(c, key); }, 300);
  }
  if (more) { more.addEventListener("click", function () { limit += SCREEN; draw(); }); }
  if (earlier) {
    earlier.addEventListener("click", function () {
      var back = Math.min(first, SCREEN);
      first -= back; limit += back;
      draw();
    });
  }

  // a row named in the address (a link from the changes page, the call graph, the
  // index) is drawn, filters cleared if they hide it, before the browser looks for it
  function reveal(id) {
    var it = byId[id];
    if (!it || document.getElementById(id)) { return; }
    var at = kept.indexOf(it);
    if (at < 0) {
      [search, fnSel, threadSel, fieldSel, fromBox, toBox].forEach(function (el) { if (el) { el.value = ""; } });
      if (onlyChanged) { onlyChanged.checked = false; table.classList.remove("only-changed"); }
      filter();
      at = kept.indexOf(it);
    }
    if (at < first || at >= first + limit) {
      first = Math.max(0, at - 100);
      limit = SCREEN;
    }
    draw();
  }
  document.addEventListener("click", function (ev) {
    var a = ev.target.closest ? ev.target.closest("a") : null;
    var href = a && a.getAttribute("href");
    if (!href || href.indexOf("#") < 0) { return; }
    var url = new URL(href, window.location.href);
    if (url.href.split("#")[0] === window.location.href.split("#")[0]) {
      reveal(decodeURIComponent(url.hash.slice(1)));
    }
  }, true);
  // the function named in the address (#fn=NAME) filters at once
  // a search in the address (#q=TEXT&fn=NAME&thread=…&field=…&from=…&to=…&changed=1,
  // as the links to other pages' matches give) is applied at once
  function fromHash() {
    var hash = window.location.hash;
    if (hash.indexOf("=") < 0) {
      if (hash) { reveal(decodeURIComponent(hash.slice(1))); }
      return;
    }
    var p = new URLSearchParams(hash.slice(1));
    var set = function (el, name) { if (el) { el.value = p.get(name) || ""; } };
    set(search, "q"); set(fnSel, "fn"); set(threadSel, "thread"); set(fieldSel, "field");
    set(fromBox, "from"); set(toBox, "to");
    if (onlyChanged) {
      onlyChanged.checked = p.get("changed") === "1";
      table.classList.toggle("only-changed", onlyChanged.checked);
    }
    apply();
    if (kept.length) { table.scrollIntoView(); }
  }
  window.addEventListener("hashchange", fromHash);
  filter();
  draw();
  fromHash();

  // time brush: drag across the strip to keep only the rows in that time window
  var brush = document.getElementById("time-brush");
  if (brush && items.length) {
    var t0 = items[0].t / 1e6, t1 = items[items.length - 1].t / 1e6;
    var span = Math.max(t1 - t0, 1e-9), bins = 120, counts = [], changed = [], b0;
    for (b0 = 0; b0 < bins; b0 += 1) { counts.push(0); changed.push(0); }
    items.forEach(function (it) {
      var b = Math.min(bins - 1, Math.floor((it.t / 1e6 - t0) / span * bins));
      counts[b] += 1;
      if (it.changed) { changed[b] += 1; }
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
    var at = function (ev) {
      var box = brush.getBoundingClientRect();
      return Math.max(0, Math.min(1000, (ev.clientX - box.left) / box.width * 1000));
    };
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
  // (CTRACER_ROWS.state) and the changes of the rows before it
  var panel = document.getElementById("row-state");
  if (panel) {
    body.addEventListener("click", function (ev) {
      var tr = ev.target.closest("tr");
      if (!tr || !tr.id || ev.target.closest("a") || !byId[tr.id]) { return; }
      var it = byId[tr.id], values = Object.assign({}, D.state[it.o] || {}), here = {};
      for (var j = 0; j <= it.at; j += 1) {
        var other = items[j];
        if (other.o !== it.o) { continue; }
        other.changes.forEach(function (c) {
          values[c[0]] = c[2];
          if (other === it) { here[c[0]] = true; }
        });
      }
      Array.prototype.forEach.call(body.querySelectorAll("tr.picked"), function (r) {
        r.classList.remove("picked");
      });
      tr.classList.add("picked");
      var out = panel.querySelector("tbody");
      out.textContent = "";
      D.fields.forEach(function (name) {
        var row = out.insertRow();
        if (here[name]) { row.className = "changed"; }
        row.insertCell().textContent = name;
        row.insertCell().textContent = name in values ? values[name] : "?";
      });
      panel.querySelector(".when").textContent =
        (it.o ? it.o + " " : "") + "at " + ms(it.t) + " ms, " +
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
