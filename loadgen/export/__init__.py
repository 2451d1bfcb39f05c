"""Exports of results files: CSV of levels (levels_csv) and InferenceX rows (infx, infx_identity)."""
