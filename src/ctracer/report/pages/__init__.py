"""The report's page writers, one module per page family, over the state they share
(`ctracer.report.pages.site`); `ctracer.report.html` runs them."""
