"""``concept-map``: the cost model's map of which communication-reduction concept is fastest where."""
