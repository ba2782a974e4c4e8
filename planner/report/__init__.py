"""Text and pictures a person reads, from plain data (plans, sweep rows, schedule documents,
simulations, run measurements): summaries, comparisons and diffs, why-not answers, tables, Gantt
charts and sweep plots. Returns strings or writes figures; never plans anything."""
