# Hot loop 1: input preparation (see DESIGN.md, "Hot loop 1"). Filled in by the executor work.
