"""scaler: watches queued demand and resizes GPU node pools just enough, within budget."""
