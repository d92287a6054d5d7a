"""What is done to models: tasks, training, interventions, dynamics, figures, reports, CLI."""
