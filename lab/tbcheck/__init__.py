"""tbcheck: ``make tb-check`` (main: a comparison opened in headless Chromium and checked) and ``make tensorboard``
(tbview: the server whose page starts with outlier scaling off); browser drives the Chromium."""
