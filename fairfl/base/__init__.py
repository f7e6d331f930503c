"""The foundations: no training and no data. The errors a user sees, atomic writes, where data,
results and figures live, progress bars, checks of user input, the one seeding scheme, the profiles,
and what makes a figure unfit for print."""
