"""``python -m outboxkit.pipeline run …``, and the file ``spark-submit`` runs::

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version> \\
        "$(python -c 'import outboxkit.pipeline as p; print(p.__path__[0])')/__main__.py" \\
        run --output s3a://lake/shop --checkpoint s3a://lake/_checkpoints/shop

Under spark-submit the master and the connector come from spark-submit, not from the settings.
"""

from outboxkit.pipeline.cli import main

if __name__ == "__main__":
    main()
