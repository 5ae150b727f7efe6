// celery_dlx console: small enhancements only; every page works without this file.
(function () {
  "use strict";
  // "select all" checkbox of a table of obituaries.
  document.querySelectorAll("input[data-enhance=select-all]").forEach(function (box) {
    box.addEventListener("change", function () {
      var form = box.closest("form");
      if (!form) return;
      form.querySelectorAll("input[type=checkbox][name=ids]").forEach(function (b) {
        b.checked = box.checked;
      });
    });
  });
  // Purging selected obituaries: fill in the count the confirmation phrase needs as a hint.
  var selected = document.getElementById("selected");
  if (selected) {
    var hint = selected.querySelector("input[name=confirm]");
    var update = function () {
      var n = selected.querySelectorAll("input[name=ids]:checked").length;
      if (hint) hint.placeholder = "purge " + n;
    };
    selected.addEventListener("change", update);
    update();
  }
})();
