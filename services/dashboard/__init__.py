"""The operator dashboard: a web view of what the model is learning (`apprentice dashboard`, port 8080).

Modules, one job each: `config` (settings), `aggregates` (graded records and model-update orders -->
curves, no network), `views` (manifests, pod status, knowledge snapshots --> page JSON, no network),
`reader` (the topics --> aggregates, a background thread), `backends` (the services' gRPC APIs, metrics
and group offsets), `auth` (the operator's key: bearer header or sign-in cookie), `app` (the Starlette
app and the listener), `templates/` and `static/` (pages; Chart.js 4.6.1 vendored from npm `chart.js`,
MIT licence in `static/chart.js.LICENSE.md`).
"""
