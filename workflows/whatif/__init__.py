"""Policy what-if (issue 31 item 1): replay recorded alerts through the production
lifecycle machines under a simulated clock (:mod:`workflows.whatif.sim`) and sum up what
each policy would have done (:mod:`workflows.whatif.figures`). Pure: no I/O, no Temporal,
no wall clock."""
