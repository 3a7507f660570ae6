"""Genomes, operators and evolutionary placement searches on deap."""
