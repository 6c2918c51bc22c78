"""The datasets room: coordl.ImageFolder and the CoordlDataset contract."""
