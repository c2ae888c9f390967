"""The check of a composed config before any process starts: every problem at once.

``rules`` (ranges, combinations, the real constructors' signatures), ``options`` (the shipped
options a message suggests), ``host`` (this host's cores and memory), ``scheduler`` (the LR
scheduler, by torch's classes), ``notices`` (what a job that passes says as it starts),
``callback`` (the Hydra callback that checks each job before Hydra creates anything),
``before_start`` (one-line failures; under torchrun or srun, one world), ``dcp_resume`` (a DCP
checkpoint to resume, checked from its files). Imports every folder but ``launch``.
"""
