"""Graph encoders and placement policies on torch-geometric."""
