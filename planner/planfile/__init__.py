"""The plan file ``planner.plan/v1``: the Plan, its JSON schema and invariants, atomic save and load,
and the names of the parts of a step. (Named ``planfile``, not ``plan``: ``planner.plan`` is the
public function.)"""
