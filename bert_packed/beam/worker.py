"""`python -m bert_packed.beam.worker`: a worker process of a pipeline run here
(--direct_running_mode=multi_processing), Beam's own, that also ends once the command that
started it is gone.

Beam's local workers are not ended by the end of the command: after a kill -9 of it they ran on,
writing, and more of them with every rerun. The command names itself to them in DRIVER (its
environment is theirs); a thread here ends the process within a second of the command's end.
"""

import json
import os
import sys
import threading
import time

from bert_packed.storage import files

DRIVER = "BERT_PACKED_BEAM_DRIVER"


def exit_with_the_driver(driver: dict) -> None:
    """Ends this process (exit status 1) within a second of the end of the process `driver`
    (files.this_process() of the command)."""

    def watch():
        while files.still_running(driver):
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="driver watch", daemon=True).start()


if __name__ == "__main__":
    if DRIVER in os.environ:
        exit_with_the_driver(json.loads(os.environ[DRIVER]))
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main(sys.argv)
