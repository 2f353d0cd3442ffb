"""calc.serve: the serving planner."""
