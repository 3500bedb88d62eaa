"""The commands' jobs: ``gi run`` (:mod:`.pipeline`), ``gi ablate``, ``gi labels`` (:mod:`.labelbench`), ``gi bench``,
``gi sweep``, and the self-contained output directories they write (:mod:`.report`)."""
