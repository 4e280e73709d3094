"""runledger and the tools around it: importers from TensorBoard, MLflow and W&B, webhook delivery of alerts and decisions, OpenLineage."""
