"""The ``ferry`` command line. It composes the subcommand groups of the packages below;
each group is imported only when it is used, so ``ferry --help`` stays fast."""
