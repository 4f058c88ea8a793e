"""What a run needs besides decoding, whichever engine decodes: building objects from the config
(``instantiate``), the software and machine it runs on (``environment``), what makes two sessions the same run
(``identity``), the thread count it runs with (``threads``) and the processes its engine starts, which end with it
(``owned_processes``)."""
