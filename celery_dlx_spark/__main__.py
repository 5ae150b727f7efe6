"""``python -m celery_dlx_spark --redis-url ... --out ...``: the export on ``local[*]``."""

import sys

from celery_dlx_spark.export import main

sys.exit(main())
