"""GraMMA: graph-conditioned exploration, a knowledge-graph environment for the same engine."""
