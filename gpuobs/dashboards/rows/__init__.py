"""The Node dashboard's rows, one module per metric family (catalog.Metric.family), each with a
`row(L)` that appends its row and panels to the layout: adding a panel for a metric touches its
family's module only; a new family is a module here and an entry in node.ROWS (the rows' order).
selectors.py holds what they share (the dashboard's matchers and the per-GPU selector `m`)."""
