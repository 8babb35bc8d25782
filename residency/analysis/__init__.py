"""Analyses of loaded timelines and decisions: all-rank idle, idle by cause, trace diff, the
timeline view, statistics and the what-if replay."""
