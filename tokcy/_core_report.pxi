# Hot loop 2: the KV-connector report (see DESIGN.md, "Hot loop 2"). Filled in by the connector work.
