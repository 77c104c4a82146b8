"""Lowering rules: one module per source op and target, each written as match / check / rewrite."""
