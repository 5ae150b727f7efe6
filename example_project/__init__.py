"""An orders service on celery_dlx: a tour of every fate (run ``python -m example_project.demo``).

Importing the package does nothing; ``example_project.app`` is the Celery app.
"""
