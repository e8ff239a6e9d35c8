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
