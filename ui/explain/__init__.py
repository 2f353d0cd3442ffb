"""The Explain page's pieces: figures (the current scenario and its what-ifs through calc/),
lessons' charts, and the articles' claims as table rows. The page only draws them."""
